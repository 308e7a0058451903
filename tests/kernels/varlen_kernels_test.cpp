// varlen_kernels_test.cpp - the varlen and paged-decode kernels pass the sequence-layout sweeps (varlen, KV
// cache, paged, decode) on the cpu backend (or ATTNFUZZ_TEST_BACKEND): every case against the per-sequence oracle.
//
// The cases come from the one case model (layout_sweep_grid): every q / k / v element outside a sequence
// holds a NaN gap poison (the runner rewrites K/V gaps with its guard poison), so a kernel that reads past a
// sequence, a used length or a page fails; LSE rows past a sequence are output canaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/verdict.h"
#include "check/runner.h"
#include "tests/kernels/test_backend.h"

namespace attnfuzz {
namespace {

Device& device(ThreadOrder order) {
  static std::map<ThreadOrder, std::unique_ptr<Device>> devices;
  auto& d = devices[order];
  if (!d) {
    DeviceOptions o;
    o.order = order;
    o.order_seed = 11;
    d = open_device(test_backend(), o);
  }
  return *d;
}

class SeqKernel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    entry_ = Registry::global().find(test_backend(), GetParam());
    ASSERT_NE(entry_, nullptr) << GetParam() << " is not registered for the " << backend_name(test_backend())
                               << " backend";
  }
  // Checks c; returns whether the kernel ran it (false: unsupported).
  bool passes(const Case& c, ThreadOrder order = ThreadOrder::kForward) {
    PreparedCase pc(c);
    const CheckResult r = check_case(device(order), *entry_, pc, RunOptions{}).result;
    if (r.verdict == Verdict::kUnsupported) return false;
    EXPECT_EQ(r.verdict, Verdict::kPass) << GetParam() << " on " << describe(c) << " (" << c.label
                                         << "): " << verdict_name(r.verdict) << " " << r.reason;
    return true;
  }
  const KernelEntry* entry_ = nullptr;
};

bool is_decode(const std::string& name) { return name == "paged-decode"; }

// Every case of every layout sweep passes, and none is refused but paged-decode's with more than 8 query tokens
// per sequence (the sweeps' head dims are at most 64, every mask and layout is declared).
TEST_P(SeqKernel, LayoutSweepsPass) {
  for (const std::string& layout : sequence_layouts()) {
    int ran = 0, expected = 0;
    for (const Case& c : layout_sweep_grid(layout, 0)) {
      expected += !is_decode(GetParam()) || c.problem.seq_q <= 8;
      ran += passes(c);
      if (HasFailure()) return;
    }
    EXPECT_EQ(ran, expected) << layout;
    EXPECT_GT(ran, 0) << layout;
  }
}

// Shuffled and reverse thread orders: the same verdicts (no race between the split / tile phases).
TEST_P(SeqKernel, ThreadOrders) {
  if (test_backend() != Backend::kCpu) GTEST_SKIP() << "thread orders exist on the cpu emulator only";
  int ran = 0;
  for (const std::string& layout : {std::string("varlen"), std::string("decode")}) {
    const std::vector<Case> cases = layout_sweep_grid(layout, 0);
    for (size_t i = 0; i < cases.size(); i += 5)
      for (ThreadOrder o : {ThreadOrder::kShuffle, ThreadOrder::kReverse}) {
        ran += passes(cases[i], o);
        if (HasFailure()) return;
      }
  }
  EXPECT_GT(ran, 0);
}

// Every accepted value of a declared tunable (paged-decode's num_splits; the split-kv detector re-runs failing
// cases with each) passes the decode sweep.
TEST_P(SeqKernel, EveryTunableValue) {
  const af_kernel& k = entry_->kernel;
  if (k.n_tunables == 0) GTEST_SKIP() << GetParam() << " declares no tunable";
  int ran = 0;
  for (int32_t vi = 0; vi < k.tunables[0].n_values; ++vi) {
    const std::vector<Case> cases = layout_sweep_grid("decode", 0);
    for (size_t i = vi % 3; i < cases.size(); i += 3) {
      Case c = cases[i];
      c.problem.tunables[0] = k.tunables[0].values[vi];
      SCOPED_TRACE(std::string(k.tunables[0].name) + "=" + std::to_string(k.tunables[0].values[vi]));
      ran += passes(c);
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(ran, 0);
}

// Issue 28: sinks, softcap and ALiBi on the sequence layouts (layout_sweep_grid's variant axis): every third case
// of the varlen, paged and decode sweeps and every variant edge (a window that leaves a token's first splits empty
// under dominant sinks, logits past a cap of 5, ALiBi over 12 heads) pass; so does every split count on the edges.
TEST_P(SeqKernel, LayoutVariantSweepsPass) {
  int ran = 0;
  for (const char* layout : {"varlen", "paged", "decode"}) {
    const std::vector<Case> cases = layout_sweep_grid(layout, 0, kLayoutVariants);
    for (size_t i = 0; i < cases.size(); ++i) {
      const bool edge = cases[i].label.find("-edge-") != std::string::npos;
      if (!edge && i % 3) continue;
      ran += passes(cases[i]);
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(ran, 10);
  const af_kernel& k = entry_->kernel;
  for (int32_t vi = 0; vi < k.n_tunables && vi < k.tunables[0].n_values; ++vi)  // the sink once at every split count
    for (const Case& edge : layout_sweep_grid("decode", 0, kLayoutVariants))
      if (edge.label.find("window16") != std::string::npos) {
        Case c = edge;
        c.problem.tunables[0] = k.tunables[0].values[vi];
        SCOPED_TRACE("num_splits=" + std::to_string(k.tunables[0].values[vi]));
        EXPECT_TRUE(passes(c));
      }
}

INSTANTIATE_TEST_SUITE_P(Kernels, SeqKernel,
                         ::testing::Values("varlen-bm16-bn16", "varlen-bm32-bn32", "paged-decode"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace attnfuzz
