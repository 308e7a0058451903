// oracle_speed.cpp - oracle cost: fast path vs the plain fp64 reference, with and without the plain reference's
// baseline rows (f32, f16, bf16: a check computes them for failures only), multiprecision per case, sampled S=16384.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "oracle/lowp.h"
#include "oracle/oracle.h"
#include "oracle/reference_fp64.h"

namespace {
using namespace attnfuzz;
using Clock = std::chrono::steady_clock;

struct Data {
  Problem p;
  std::vector<float> q, k, v;
};
Data make(int64_t S, int64_t D, int64_t H, uint64_t seed) {
  Data x;
  x.p = make_problem(1, H, H, S, S, D, D);
  x.q.resize(q_elements(x.p)), x.k.resize(k_elements(x.p)), x.v.resize(v_elements(x.p));
  uint64_t st = seed;
  auto rnd = [&] {  // uniform(-2, 2) from splitmix64
    uint64_t z = (st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<float>(((z ^ (z >> 31)) >> 11) * 0x1p-53 * 4 - 2);
  };
  for (auto* t : {&x.q, &x.k, &x.v})
    for (auto& e : *t) e = rnd();
  return x;
}

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void fast_vs_fp64(const char* tag, int64_t S, int64_t D, int reps) {
  const Data x = make(S, D, 1, 42);
  OracleOptions o1;
  o1.threads = 1;
  o1.baseline = false;
  OracleOptions o2 = o1;
  o2.threads = 0;
  volatile double sink = 0;
  const double t64 =
      best_seconds(reps, [&] { sink = reference_fp64(x.p, x.q.data(), x.k.data(), x.v.data()).o[0]; });
  int64_t fallback = 0;
  const double tf = best_seconds(reps, [&] {
    const OracleResult r = compute_oracle(x.p, x.q.data(), x.k.data(), x.v.data(), o1);
    fallback = r.rows_fallback;
    sink = r.o[0];
  });
  const double tf2 =
      best_seconds(reps, [&] { sink = compute_oracle(x.p, x.q.data(), x.k.data(), x.v.data(), o2).o[0]; });
  OracleOptions ob = o1;
  ob.baseline = true;
  const double tfb =
      best_seconds(reps, [&] { sink = compute_oracle(x.p, x.q.data(), x.k.data(), x.v.data(), ob).o[0]; });
  std::printf("%s.fp64_plain_s=%.4f\n", tag, t64);
  std::printf("%s.fast_1thread_s=%.4f\n", tag, tf);
  std::printf("%s.fast_over_fp64=%.2f\n", tag, tf / t64);
  std::printf("%s.fast_with_fp32_baseline_1thread_s=%.4f\n", tag, tfb);
  std::printf("%s.fast_with_fp32_baseline_over_fp64=%.2f\n", tag, tfb / t64);
  std::printf("%s.fast_all_threads_s=%.4f\n", tag, tf2);
  std::printf("%s.fast_rows_fell_back=%lld\n", tag, (long long)fallback);
}

// A check's oracle in a low-precision dtype (inputs of the dtype), alone and with the baseline rows (the plain
// reference in that dtype, reference_lowp_row), which a check now computes only when it fails (check/runner.cpp).
void baseline_cost(const char* tag, int64_t S, int64_t D, int32_t dtype, int reps) {
  Data x = make(S, D, 1, 43);
  x.p.dtype = dtype;
  for (auto* t : {&x.q, &x.k, &x.v})
    for (float& f : *t) f = round_to_dtype(f, dtype);
  OracleOptions o;
  o.threads = 1;
  o.baseline = false;
  OracleOptions ob = o;
  ob.baseline = true;
  volatile double sink = 0;
  const double t = best_seconds(reps, [&] { sink = compute_oracle(x.p, x.q.data(), x.k.data(), x.v.data(), o).o[0]; });
  const double tb =
      best_seconds(reps, [&] { sink = compute_oracle(x.p, x.q.data(), x.k.data(), x.v.data(), ob).o[0]; });
  std::printf("%s.exact_1thread_s=%.4f\n", tag, t);
  std::printf("%s.exact_with_baseline_1thread_s=%.4f\n", tag, tb);
  std::printf("%s.with_baseline_over_exact=%.2f  (what a passing check no longer pays)\n", tag, tb / t);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 2 || (argc > 1 && !quick)) {
    std::fprintf(stderr, "usage: %s [--quick]\n", "oracle_speed");
    return 2;
  }
  std::printf("mp_backend=%s\n", oracle_has_mpfr() ? "mpfr" : "cpp_bin_float");
  fast_vs_fp64("s256_d64", 256, 64, quick ? 1 : 5);
  fast_vs_fp64("s1024_d128", 1024, 128, quick ? 1 : 3);
  baseline_cost("f16_s256_d64", 256, 64, AF_DTYPE_F16, quick ? 1 : 5);
  baseline_cost("bf16_s256_d64", 256, 64, AF_DTYPE_BF16, quick ? 1 : 5);

  {  // multiprecision cost per case (the arbiter; every row forced)
    const Data x = make(256, 64, 1, 7);
    OracleOptions o;
    o.threads = 1;
    o.force_multiprecision = true;
    o.baseline = false;
    const auto t0 = Clock::now();
    const OracleResult r = compute_oracle(x.p, x.q.data(), x.k.data(), x.v.data(), o);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    o.threads = 1;
    o.force_multiprecision = false;
    const auto t1 = Clock::now();
    compute_oracle(x.p, x.q.data(), x.k.data(), x.v.data(), o);
    const double tf = std::chrono::duration<double>(Clock::now() - t1).count();
    std::printf("mp_s256_d64_bits=%d\n", r.mp_bits_used);
    std::printf("mp_s256_d64_1thread_s=%.3f\n", t);
    std::printf("mp_s256_d64_over_fast=%.1f\n", t / tf);
    std::printf("mp_per_row_ms=%.3f\n", 1e3 * t / 256);
  }

  if (!quick) {  // long sequence with row sampling, all cores
    const Data x = make(16384, 128, 1, 9);
    OracleOptions o;
    o.row_budget = 2048;
    const auto t0 = Clock::now();
    const OracleResult r = compute_oracle(x.p, x.q.data(), x.k.data(), x.v.data(), o);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("s16384_d128_sampled_rows=%lld\n", (long long)r.rows_computed);
    std::printf("s16384_d128_sampled_rows_fell_back=%lld\n", (long long)r.rows_fallback);
    std::printf("s16384_d128_sampled_s=%.2f\n", t);
    std::printf("s16384_d128_peak_rss_mb=%.1f\n", ru.ru_maxrss / 1024.0);
  }
  return 0;
}
