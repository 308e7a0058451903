// mla_decode.cpp - the oracle's check time of an MLA-shaped decode case (kv-shared: V a view of K's first Dv
// columns) against the same case with V copied out, side by side in one run (issue 28 item 5).
//   mla_decode [--reps N] [--heads H] [--sk N] [--threads T]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "oracle/oracle.h"

using namespace attnfuzz;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Best of reps forward oracle runs; the problem's strides say where V lives.
double time_oracle(const Problem& p, const float* q, const float* k, const float* v, int reps, int threads) {
  OracleOptions o;
  o.threads = threads;
  o.baseline = false;
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)compute_oracle(p, q, k, v, o);
    best = std::min(best, ms_since(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, threads = 1;
  int64_t heads = 128, sk = 4096;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--heads")) heads = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--sk")) sk = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  }
  if (reps < 1 || heads < 1 || sk < 1 || threads < 1) {
    std::fprintf(stderr, "mla_decode: --reps, --heads, --sk and --threads need >= 1\n");
    return 2;
  }
  const int64_t D = 576, Dv = 512;
  const Problem copied = make_problem(1, heads, 1, 1, sk, D, Dv);  // decode: Sq = 1, all heads on one latent
  Problem shared = copied;
  share_kv(shared);  // AF_VARIANT_KV_SHARED: the oracle reads V through K's pointer
  std::mt19937 rng(0x5eed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(heads * D)), k(static_cast<size_t>(sk * D)), v(static_cast<size_t>(sk * Dv));
  for (float& x : q) x = nd(rng);
  for (float& x : k) x = nd(rng);
  for (int64_t j = 0; j < sk; ++j)
    for (int64_t d = 0; d < Dv; ++d) v[static_cast<size_t>(j * Dv + d)] = k[static_cast<size_t>(j * D + d)];
  std::printf("# oracle forward check time, B=1 Hq=%lld Hkv=1 Sq=1 Sk=%lld D=%lld Dv=%lld, best of %d, %d thread(s)\n",
              (long long)heads, (long long)sk, (long long)D, (long long)Dv, reps, threads);
  const double c = time_oracle(copied, q.data(), k.data(), v.data(), reps, threads);
  const double s = time_oracle(shared, q.data(), k.data(), k.data(), reps, threads);
  std::printf("case=copied-v   fwd_ms=%9.2f\n", c);
  std::printf("case=kv-shared  fwd_ms=%9.2f ratio=%5.2f\n", s, s / c);
  return 0;
}
