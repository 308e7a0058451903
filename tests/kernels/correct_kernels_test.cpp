// correct_kernels_test.cpp - every correct cpu kernel against the fp64 reference: shapes, masks, GQA,
// strides, NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnfuzz/device.h"
#include "attnfuzz/problem.h"
#include "attnfuzz/registry.h"
#include "oracle/reference_fp64.h"
#include "tests/kernels/test_backend.h"

namespace attnfuzz {
namespace {

// The correct kernels shipped in kernels/*.hip (planted-bug kernels have family "planted/...").
const char* const kCorrectKernels[] = {"materialized",    "online-row",      "flash-bm16-bn16",
                                       "flash-bm16-bn32", "flash-bm16-bn64", "flash-bm32-bn32",
                                       "split-kv",        "varlen-bm16-bn16", "varlen-bm32-bn32"};
// Correct kernels for decode only (1..8 query tokens), so the dense grids below do not fit them; they are
// tested on the sequence-layout sweeps (tests/kernels/varlen_kernels_test.cpp) and mla-decode on the
// kv-shared ones (tests/kernels/mla_kernels_test.cpp).
const char* const kDecodeKernels[] = {"paged-decode", "mla-decode"};
// Merge kernels (AF_KIND_MERGE, issue 29): checked on the merge sweep (tests/check/planted_classify_test.cpp
// PlantedMerge, tests/check/merge_test.cpp).
const char* const kMergeKernels[] = {"merge-states", "merge-states-online"};

// Poison for output and workspace buffers: a quiet NaN with a payload no arithmetic produces.
constexpr uint32_t kPoisonBits = 0x7fc0dead;
bool is_poison(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u == kPoisonBits;
}

struct Inputs {
  std::vector<float> q, k, v;
};

// Uniform [-amp, amp] values everywhere in the spanned buffers (gaps included: they must not matter).
Inputs random_inputs(const Problem& p, uint64_t seed, float amp = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-amp, amp);
  Inputs in;
  in.q.resize(std::max<int64_t>(q_elements(p), 1));
  in.k.resize(std::max<int64_t>(k_elements(p), 1));
  in.v.resize(std::max<int64_t>(v_elements(p), 1));
  for (auto* t : {&in.q, &in.k, &in.v})
    for (float& x : *t) x = u(rng);
  return in;
}

struct Output {
  LaunchResult result;
  std::vector<float> o, lse;  // as laid out by p's strides
};

Output run(Device& dev, const af_kernel& k, const Problem& p, const Inputs& in) {
  auto bytes = [](int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float); };
  const size_t ws_bytes = k.workspace_bytes ? k.workspace_bytes(&p) : 0;
  void* q = dev.alloc(bytes(q_elements(p)));
  void* kk = dev.alloc(bytes(k_elements(p)));
  void* v = dev.alloc(bytes(v_elements(p)));
  void* o = dev.alloc(bytes(o_elements(p)));
  void* lse = dev.alloc(bytes(lse_elements(p)));
  void* ws = ws_bytes ? dev.alloc(ws_bytes) : nullptr;
  dev.to_device(q, in.q.data(), in.q.size() * sizeof(float));
  dev.to_device(kk, in.k.data(), in.k.size() * sizeof(float));
  dev.to_device(v, in.v.data(), in.v.size() * sizeof(float));
  dev.fill(o, &kPoisonBits, 4, bytes(o_elements(p)));
  dev.fill(lse, &kPoisonBits, 4, bytes(lse_elements(p)));
  if (ws) dev.fill(ws, &kPoisonBits, 4, ws_bytes & ~size_t{3});
  af_buffers b{q, kk, v, o, k.writes_lse ? static_cast<float*>(lse) : nullptr, ws};
  Output out;
  out.result = dev.launch(k, p, b);
  out.o.resize(std::max<int64_t>(o_elements(p), 1));
  out.lse.resize(std::max<int64_t>(lse_elements(p), 1));
  dev.to_host(out.o.data(), o, out.o.size() * sizeof(float));
  dev.to_host(out.lse.data(), lse, out.lse.size() * sizeof(float));
  for (void* x : {q, kk, v, o, lse, ws})
    if (x) dev.free(x);
  return out;
}

// Per-element tolerance for an fp32 kernel against the fp64 reference (the real bound is the oracle's).
double tolerance(double ref) { return 3e-5 * (1.0 + std::fabs(ref)); }

// Compares one value; NaN must match NaN, infinities must match exactly, finite within tol. Returns "" or
// a description of the mismatch.
std::string compare_one(double ref, float got) {
  if (is_poison(got)) return "never written (poison)";
  if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) && std::isnan(got) ? "" : "NaN mismatch";
  if (std::isinf(ref) || std::isinf(got)) return ref == static_cast<double>(got) ? "" : "Inf mismatch";
  return std::fabs(static_cast<double>(got) - ref) <= tolerance(ref) ? "" : "beyond tolerance";
}

// Checks O and LSE against the fp64 reference, that fully masked rows are exactly 0 / -inf, and that
// padding between rows / heads / batches of O and LSE is untouched. Counts failures; never folds errors
// with max (which would drop NaN).
void check_against_reference(const af_kernel& k, const Problem& p, const Inputs& in, const Output& out) {
  ASSERT_EQ(out.result.status, LaunchStatus::kOk) << k.name << ": " << out.result.message;
  const Fp64Result ref = reference_fp64(p, in.q.data(), in.k.data(), in.v.data());
  int64_t bad = 0;
  std::string first;
  std::vector<char> o_written(out.o.size(), 0), lse_written(out.lse.size(), 0);
  auto fail = [&](const std::string& what) {
    if (bad++ == 0) first = what;
  };
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const double ref_lse = ref.lse[fp64_lse_index(p, b, h, i)];
        const bool masked = ref_lse == -std::numeric_limits<double>::infinity();
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          const int64_t at = o_index(p, b, i, h, d);
          o_written[at] = 1;
          const double r = ref.o[fp64_o_index(p, b, i, h, d)];
          const float g = out.o[at];
          const std::string why =
              masked ? (g == 0.0f ? "" : "fully masked row not exactly 0") : compare_one(r, g);
          if (!why.empty())
            fail("O[b=" + std::to_string(b) + ",i=" + std::to_string(i) + ",h=" + std::to_string(h) + ",d=" +
                 std::to_string(d) + "] ref " + std::to_string(r) + " got " + std::to_string(g) + ": " + why);
        }
        if (k.writes_lse) {
          const int64_t at = lse_index(p, b, h, i);
          lse_written[at] = 1;
          const std::string why = compare_one(ref_lse, out.lse[at]);
          if (!why.empty())
            fail("LSE[b=" + std::to_string(b) + ",h=" + std::to_string(h) + ",i=" + std::to_string(i) +
                 "] ref " + std::to_string(ref_lse) + " got " + std::to_string(out.lse[at]) + ": " + why);
        }
      }
  for (size_t x = 0; x < out.o.size(); ++x)
    if (!o_written[x] && !is_poison(out.o[x]) && o_elements(p) > 0)
      fail("O padding element " + std::to_string(x) + " written");
  if (k.writes_lse)
    for (size_t x = 0; x < out.lse.size(); ++x)
      if (!lse_written[x] && !is_poison(out.lse[x]))
        fail("LSE padding element " + std::to_string(x) + " written");
  EXPECT_EQ(bad, 0) << k.name << " " << describe(p) << ": " << bad << " bad elements; first: " << first;
}

Problem with_mask(Problem p, const std::string& mask) {
  const std::string err = parse_mask(mask, p);
  EXPECT_EQ(err, "");
  return p;
}

// Pads q/k/v/o rows and heads and batches (non-contiguous strides) and LSE rows.
void pad_strides(Problem& p, int64_t head_pad, int64_t row_pad, int64_t batch_pad) {
  auto set = [&](int64_t* s, int64_t heads, int64_t seq, int64_t dim) {
    s[2] = dim + head_pad;
    s[1] = heads * s[2] + row_pad;
    s[0] = seq * s[1] + batch_pad;
  };
  set(p.q_stride, p.heads_q, p.seq_q, p.head_dim);
  set(p.k_stride, p.heads_kv, p.seq_k, p.head_dim);
  set(p.v_stride, p.heads_kv, p.seq_k, p.head_dim_v);
  set(p.o_stride, p.heads_q, p.seq_q, p.head_dim_v);
  p.lse_stride[2] = 2;
  p.lse_stride[1] = p.seq_q * 2 + 3;
  p.lse_stride[0] = p.heads_q * p.lse_stride[1] + 5;
}

std::unique_ptr<Device> test_device() { return open_device(test_backend(), DeviceOptions{}); }

std::unique_ptr<Device> cpu_device(ThreadOrder order = ThreadOrder::kForward, uint64_t seed = 1) {
  DeviceOptions o;
  o.order = order;
  o.order_seed = seed;
  return open_device("cpu", o);
}

class CorrectKernel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    entry_ = Registry::global().find(test_backend(), GetParam());
    ASSERT_NE(entry_, nullptr) << GetParam() << " is not registered for the " << backend_name(test_backend())
                               << " backend";
    dev_ = test_device();
  }
  const af_kernel& kernel() const { return entry_->kernel; }
  // Runs and checks when the kernel claims support; returns false (and checks nothing) otherwise.
  bool run_and_check(const Problem& p, const Inputs& in) {
    EXPECT_EQ(validate(p), "") << describe(p);
    if (!unsupported_reason(kernel(), p).empty()) return false;
    const Output out = run(*dev_, kernel(), p, in);
    check_against_reference(kernel(), p, in, out);
    return true;
  }
  bool run_and_check(const Problem& p, uint64_t seed = 1) { return run_and_check(p, random_inputs(p, seed)); }

  const KernelEntry* entry_ = nullptr;
  std::unique_ptr<Device> dev_;
};

const char* const kMasks[] = {"none", "causal-tl", "causal-br", "window:5,3-br", "window:2,0-tl"};

// Shapes x D x masks, B = 1, Hq = Hkv = 1 (the full cross product: cheap at one head).
TEST_P(CorrectKernel, ShapeGrid) {
  const int64_t shapes[][2] = {{1, 1}, {7, 13}, {13, 7}, {33, 31}, {65, 33}, {128, 64}, {17, 150}};
  int ran = 0;
  for (auto [sq, sk] : shapes)
    for (int64_t d : {1, 13, 59, 64, 128})
      for (const char* mask : kMasks) {
        const Problem p = with_mask(make_problem(1, 1, 1, sq, sk, d, d), mask);
        SCOPED_TRACE(describe(p));
        ran += run_and_check(p, static_cast<uint64_t>(sq * 1000003 + sk * 1009 + d));
        if (HasFailure()) return;
      }
  EXPECT_EQ(ran, 7 * 5 * 5) << "kernel refused shapes it should support";
}

// Batch 2 with GQA (Hq = 4 over Hkv = 4, 2, 1) under every mask.
TEST_P(CorrectKernel, BatchAndGqa) {
  for (int64_t hkv : {4, 2, 1})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{7, 13}, {33, 31}})
      for (const char* mask : kMasks) {
        const Problem p = with_mask(make_problem(2, 4, hkv, sq, sk, 59, 59), mask);
        SCOPED_TRACE(describe(p));
        EXPECT_TRUE(run_and_check(p, static_cast<uint64_t>(hkv * 31 + sq)));
        if (HasFailure()) return;
      }
}

// Dv != D both ways.
TEST_P(CorrectKernel, DvDiffersFromD) {
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{13, 59}, {64, 7}, {1, 128}})
    for (const char* mask : {"none", "causal-br"}) {
      const Problem p = with_mask(make_problem(1, 2, 1, 19, 40, d, dv), mask);
      SCOPED_TRACE(describe(p));
      if (kernel().needs_dv_eq_d) continue;
      EXPECT_TRUE(run_and_check(p, static_cast<uint64_t>(d * 7 + dv)));
    }
}

// Padding between heads, rows and batches of q/k/v/o, and between LSE rows: results as contiguous,
// padding of O and LSE untouched (random values in input padding must not matter).
TEST_P(CorrectKernel, NonContiguousStrides) {
  for (const char* mask : {"none", "causal-tl", "window:4,4-br"}) {
    Problem p = with_mask(make_problem(2, 4, 2, 21, 37, 24, 24), mask);
    pad_strides(p, 5, 3, 11);
    SCOPED_TRACE(describe(p));
    EXPECT_TRUE(run_and_check(p, 77));
  }
}

// Larger logits (scores up to ~+-40): the running max changes by large amounts, exp underflows.
TEST_P(CorrectKernel, LargeLogits) {
  for (const char* mask : {"none", "causal-br"}) {
    const Problem p = with_mask(make_problem(1, 2, 2, 45, 70, 32, 32), mask);
    SCOPED_TRACE(describe(p));
    EXPECT_TRUE(run_and_check(p, random_inputs(p, 5, 3.0f)));
  }
}

// Sk = 0: every row fully masked: O exactly 0, LSE -inf.
TEST_P(CorrectKernel, EmptyKeys) {
  for (const char* mask : {"none", "causal-br", "causal-tl"}) {
    const Problem p = with_mask(make_problem(2, 2, 1, 5, 0, 13, 13), mask);
    SCOPED_TRACE(describe(p));
    EXPECT_TRUE(run_and_check(p, 3));
  }
}

// Rows with no visible key in the middle of other rows: causal-br with Sq > Sk (the first Sq - Sk rows),
// a window entirely past the keys (window:0,0-tl with Sq > Sk), a window left of every key.
TEST_P(CorrectKernel, FullyMaskedRows) {
  struct C {
    int64_t sq, sk;
    const char* mask;
  };
  for (C c : {C{40, 9, "causal-br"}, C{40, 9, "window:0,0-tl"}, C{50, 20, "window:0,2-br"},
              C{70, 20, "window:3,1-br"}}) {
    const Problem p = with_mask(make_problem(1, 2, 1, c.sq, c.sk, 16, 16), c.mask);
    SCOPED_TRACE(describe(p));
    int64_t masked_rows = 0;
    for (int64_t i = 0; i < p.seq_q; ++i) masked_rows += visible_keys(p, i).empty();
    EXPECT_GT(masked_rows, 0);
    EXPECT_TRUE(run_and_check(p, 9));
  }
}

// Non-finite inputs: NaN / Inf in K and V at masked positions never reach the output; a NaN in q_i or
// a NaN / +Inf visible score makes row i NaN; a -inf visible score has weight 0; rows whose visible
// scores are all -inf are fully masked. (All as the fp64 reference computes them.)
TEST_P(CorrectKernel, NonFinite) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  {  // poison keys that only late rows see (causal-tl): early rows stay finite
    const Problem p = with_mask(make_problem(1, 1, 1, 33, 33, 20, 20), "causal-tl");
    Inputs in = random_inputs(p, 11);
    for (int64_t d = 0; d < p.head_dim; ++d) in.k[k_index(p, 0, 20, 0, d)] = nan;
    for (int64_t d = 0; d < p.head_dim_v; ++d) in.v[v_index(p, 0, 25, 0, d)] = inf;
    in.v[v_index(p, 0, 30, 0, 3)] = nan;
    SCOPED_TRACE("masked NaN/Inf in K/V, causal-tl");
    EXPECT_TRUE(run_and_check(p, in));
  }
  {  // a sliding window: NaN keys left and right of the window of some rows
    const Problem p = with_mask(make_problem(1, 1, 1, 40, 40, 8, 8), "window:3,2-tl");
    Inputs in = random_inputs(p, 12);
    for (int64_t d = 0; d < p.head_dim; ++d) in.k[k_index(p, 0, 10, 0, d)] = nan;
    for (int64_t d = 0; d < p.head_dim_v; ++d) in.v[v_index(p, 0, 30, 0, d)] = nan;
    SCOPED_TRACE("masked NaN in K/V, window");
    EXPECT_TRUE(run_and_check(p, in));
  }
  {  // NaN in q of one row; +inf scores in another; -inf scores (weight 0) in a third
    const Problem p = with_mask(make_problem(1, 1, 1, 24, 30, 16, 16), "none");
    Inputs in = random_inputs(p, 13);
    in.q[q_index(p, 0, 3, 0, 5)] = nan;
    for (int64_t d = 0; d < p.head_dim; ++d)
      in.q[q_index(p, 0, 7, 0, d)] = std::fabs(in.q[q_index(p, 0, 7, 0, d)]);
    in.k[k_index(p, 0, 12, 0, 0)] = inf;  // row 7 (all q > 0): score +inf -> NaN row; other rows +-inf or NaN
    SCOPED_TRACE("NaN q row, +inf key");
    EXPECT_TRUE(run_and_check(p, in));
  }
  {  // -inf scores: q rows positive, one key -inf in dim 0: that key has weight 0 for positive-q rows
    const Problem p = with_mask(make_problem(1, 1, 1, 10, 20, 4, 4), "causal-br");
    Inputs in = random_inputs(p, 14);
    for (float& x : in.q) x = std::fabs(x) + 0.1f;
    for (int64_t j : {0, 3, 11, 12}) in.k[k_index(p, 0, j, 0, 0)] = -inf;
    // row 0 sees keys 0..10 -> finite; make keys 0..10 all -inf for row 0? keep mixed: rows see both kinds
    SCOPED_TRACE("-inf scores");
    EXPECT_TRUE(run_and_check(p, in));
  }
  {  // every visible score -inf for some rows (window of width 1 on -inf keys): fully masked semantics
    const Problem p = with_mask(make_problem(1, 1, 1, 12, 12, 4, 4), "window:0,0-tl");
    Inputs in = random_inputs(p, 15);
    for (float& x : in.q) x = std::fabs(x) + 0.1f;
    for (int64_t j : {2, 5, 6}) in.k[k_index(p, 0, j, 0, 1)] = -inf;
    SCOPED_TRACE("rows whose only visible score is -inf");
    EXPECT_TRUE(run_and_check(p, in));
  }
}

// A correct kernel gives the same bits under forward, reverse and shuffled thread orders.
TEST_P(CorrectKernel, BitIdenticalAcrossThreadOrders) {
  if (test_backend() != Backend::kCpu) GTEST_SKIP() << "thread orders exist on the cpu emulator only";
  const Problem problems[] = {with_mask(make_problem(2, 4, 2, 33, 31, 59, 59), "causal-br"),
                              with_mask(make_problem(1, 2, 1, 70, 45, 64, 48), "window:9,4-tl")};
  for (const Problem& p : problems) {
    if (!unsupported_reason(kernel(), p).empty()) continue;
    SCOPED_TRACE(describe(p));
    const Inputs in = random_inputs(p, 21);
    const Output fwd = run(*dev_, kernel(), p, in);
    check_against_reference(kernel(), p, in, fwd);
    struct O {
      ThreadOrder order;
      uint64_t seed;
    };
    for (O o : {O{ThreadOrder::kReverse, 1}, O{ThreadOrder::kShuffle, 1}, O{ThreadOrder::kShuffle, 99}}) {
      auto dev = cpu_device(o.order, o.seed);
      const Output other = run(*dev, kernel(), p, in);
      ASSERT_EQ(other.result.status, LaunchStatus::kOk) << other.result.message;
      EXPECT_EQ(0, std::memcmp(fwd.o.data(), other.o.data(), fwd.o.size() * sizeof(float)))
          << "O differs under order " << thread_order_name(o.order) << "/" << o.seed;
      EXPECT_EQ(0, std::memcmp(fwd.lse.data(), other.lse.data(), fwd.lse.size() * sizeof(float)))
          << "LSE differs under order " << thread_order_name(o.order) << "/" << o.seed;
    }
  }
}

// Every value of every declared tunable (ABI v2; e.g. split-kv's num_splits) is a correct kernel too:
// the split-kv detector re-runs failing cases with each of them, so none may fail on its own.
TEST_P(CorrectKernel, EveryAcceptedTunableValue) {
  if (kernel().n_tunables == 0) GTEST_SKIP() << GetParam() << " declares no tunable";
  struct S {
    int64_t b, hq, hkv, sq, sk, d, dv;
  };
  const S shapes[] = {{1, 1, 1, 1, 1, 64, 64},   {1, 1, 1, 7, 13, 59, 59},   {2, 4, 2, 33, 31, 17, 24},
                      {1, 2, 1, 1, 150, 32, 32}, {1, 1, 1, 17, 150, 13, 13}, {2, 2, 1, 5, 0, 13, 13},
                      {1, 1, 1, 40, 9, 16, 16}};
  int ran = 0;
  for (int32_t t = 0; t < kernel().n_tunables; ++t) {
    const af_tunable& tu = kernel().tunables[t];
    ASSERT_GE(tu.n_values, 1);
    for (int32_t vi = 0; vi < tu.n_values; ++vi)
      for (const S& sh : shapes)
        for (const char* mask : kMasks) {
          Problem p = with_mask(make_problem(sh.b, sh.hq, sh.hkv, sh.sq, sh.sk, sh.d, sh.dv), mask);
          resolve_tunables(kernel(), p);
          p.tunables[t] = tu.values[vi];
          SCOPED_TRACE(describe(p) + " " + tunables_to_string(kernel(), p));
          ran += run_and_check(p, static_cast<uint64_t>(sh.sq * 131 + sh.sk + vi));
          if (HasFailure()) return;
        }
  }
  EXPECT_GT(ran, 0);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CorrectKernel,
                         ::testing::ValuesIn(std::vector<std::string>(std::begin(kCorrectKernels),
                                                                      std::end(kCorrectKernels))),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// The table above lists every correct built-in kernel, and each declares what the tests rely on.
TEST(CorrectKernels, RegistryListsExactlyTheseKernels) {
  std::vector<std::string> names;
  for (const auto& e : Registry::global().all())
    if (e.backend == test_backend() && e.origin == "built-in" &&
        std::string(e.kernel.family).rfind("planted/", 0) != 0)
      names.push_back(e.kernel.name);
  std::vector<std::string> want(std::begin(kCorrectKernels), std::end(kCorrectKernels));
  want.insert(want.end(), std::begin(kDecodeKernels), std::end(kDecodeKernels));
  want.insert(want.end(), std::begin(kMergeKernels), std::end(kMergeKernels));
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
  for (const char* n : kCorrectKernels) {
    const KernelEntry* e = Registry::global().find(test_backend(), n);
    ASSERT_NE(e, nullptr) << n;
    EXPECT_EQ(e->kernel.writes_lse, 1) << n;
    EXPECT_EQ(e->kernel.needs_dv_eq_d, 0) << n;
    EXPECT_TRUE(e->kernel.masks == 0 || e->kernel.masks == AF_SUPPORTS_ALL_MASKS) << n;
  }
}

// Shapes beyond a kernel's declared limits are refused by the launch function itself, not run.
TEST(CorrectKernels, LaunchRefusesDeclaredLimits) {
  for (const char* n : kCorrectKernels) {
    const af_kernel& k = Registry::global().find(test_backend(), n)->kernel;
    if (!k.max_head_dim) continue;
    const Problem p = make_problem(1, 1, 1, 4, 4, k.max_head_dim + 1, 4);
    EXPECT_NE(unsupported_reason(k, p), "") << n;
    ASSERT_NE(k.check_support, nullptr) << n;
    EXPECT_NE(k.check_support(&p, nullptr, 0), 0) << n;
  }
}

}  // namespace
}  // namespace attnfuzz
