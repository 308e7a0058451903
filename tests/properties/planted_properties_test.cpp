// planted_properties_test.cpp - each property catches a planted bug: it fails, shrinks, saves a replayable
// case.
//
// For every property, one planted-bug kernel it is known to catch (properties/README.md has the whole
// property x planted-bug table from an attn-props run). The test expects the RapidCheck run to fail with
// a reproduce string, a minimal case, and saved corpus files that read back; for the relation properties
// (tolerance bound(A) + bound(B), where the exact results of A and B are equal) at least one saved case
// must fail check_case on its own, so `attn-check --replay FILE --kernel NAME` shows the failure too.
#include <gtest/gtest.h>

#include <mutex>
#include <ostream>
#include <string>

#include "attnfuzz/corpus.h"
#include "attnfuzz/registry.h"
#include "properties/properties.h"

#ifndef ATTNFUZZ_PLANTED_PLUGIN
#error "ATTNFUZZ_PLANTED_PLUGIN (path of libattnfuzz_planted_cpu.so) must be defined"
#endif

namespace attnfuzz::props {
namespace {

const KernelEntry& planted(const std::string& name) {
  static std::once_flag once;
  std::call_once(once, [] {
    Registry::global().load_plugin(ATTNFUZZ_PLANTED_PLUGIN);
    Registry::global().load_plugin(ATTNFUZZ_ROW_LEAK_PLUGIN);
  });
  const KernelEntry* k = Registry::global().find(Backend::kCpu, name);
  if (!k) throw std::runtime_error(name + " is not in the planted plug-in");
  return *k;
}

struct Catch {
  Property property;
  const char* kernel;
  Pass pass = Pass::kFwd;
  int32_t dtype = AF_DTYPE_F32;
};

class PlantedCatch : public ::testing::TestWithParam<Catch> {};

TEST_P(PlantedCatch, PropertyFailsShrinksAndSaves) {
  const Catch& c = GetParam();
  const KernelEntry& k = planted(c.kernel);
  PropertyOptions o;
  o.max_success = 40;
  o.use_rc_params = false;  // the expectation holds for this fixed seed and budget
  o.pass = c.pass;
  o.dtype = c.dtype;
  o.out = std::filesystem::path(ATTNFUZZ_PROPERTY_TEST_OUT) / property_name(c.property);
  const PropertyOutcome r = run_property(c.property, k, o);
  ASSERT_FALSE(r.passed) << property_name(c.property) << " did not catch " << c.kernel << " in "
                         << o.max_success << " cases";
  EXPECT_FALSE(r.gave_up);
  EXPECT_EQ(r.reproduce.rfind("RC_PARAMS=\"reproduce=", 0), 0u) << r.reproduce;
  EXPECT_FALSE(r.minimal_case.empty());
  ASSERT_FALSE(r.saved.empty());
  ASSERT_EQ(r.saved.size(), r.replay.size());
  bool some_case_fails = false;
  for (size_t i = 0; i < r.saved.size(); ++i) {
    EXPECT_NE(r.replay[i].find("attn-check --replay "), std::string::npos) << r.replay[i];
    EXPECT_NE(r.replay[i].find("--kernel " + std::string(c.kernel)), std::string::npos) << r.replay[i];
    EXPECT_NE(r.replay[i].find("--plugin "), std::string::npos) << r.replay[i];
    const CorpusFile f = read_corpus_file(r.saved[i]);
    ASSERT_TRUE(f.verdict.has_value());
    EXPECT_EQ(f.verdict->kernel, c.kernel);
    EXPECT_EQ(f.the_case.pass, c.pass);
    some_case_fails |= f.verdict->verdict == Verdict::kFail;
  }
  if (c.property != Property::kDeterminism)
    EXPECT_TRUE(some_case_fails) << "no saved case fails check_case on its own";
  std::cout << property_name(c.property) << " caught " << c.kernel << ": " << r.failure
            << "\n  minimal case: " << r.minimal_case << "\n  " << r.reproduce << "\n";
}

// Readable test parameters in ctest's and gtest's output.
void PrintTo(const Catch& c, std::ostream* os) {
  *os << property_name(c.property) << " on " << c.kernel << " (" << pass_name(c.pass) << ")";
}

std::string catch_name(const ::testing::TestParamInfo<Catch>& info) {
  std::string n = std::string(property_name(info.param.property)) + "__" + info.param.kernel;
  if (info.param.pass != Pass::kFwd) n += std::string("__") + pass_name(info.param.pass);
  if (info.param.dtype != AF_DTYPE_F32) n += std::string("__") + dtype_name(info.param.dtype);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

// One planted bug per property (from the README table: each of these is caught at this budget and seed).
INSTANTIATE_TEST_SUITE_P(
    Planted, PlantedCatch,
    ::testing::Values(Catch{Property::kOracle, "planted-no-acc-rescale"},
                      Catch{Property::kKeyPermutation, "planted-no-acc-rescale"},
                      Catch{Property::kKeyShift, "planted-masked-score-zero"},
                      Catch{Property::kCausalPrefix, "planted-causal-off-by-one"},
                      Catch{Property::kRowIndependence, "test-row-leak-tile-max"},
                      Catch{Property::kBatchHead, "planted-tail-k-oob-read"},
                      Catch{Property::kDeterminism, "planted-no-score-barrier"},
                      Catch{Property::kPacking, "planted-varlen-causal-batch-max"},
                      Catch{Property::kPacking, "planted-varlen-cu-off-by-one"},
                      // Score variants (issue 28): a huge softcap against none (an
                      // exp-based tanh cancels to 0 there).
                      Catch{Property::kVariants, "planted-softcap-exp"},
                      // Merged states (issue 29): other split points in another state
                      // layout; the LSE of a base-2 merge.
                      Catch{Property::kMerge, "planted-merge-stride-of-output"},
                      Catch{Property::kMerge, "planted-merge-lse-base2"},
                      // Dropout (issue 29): p = 0 against no dropout (1 / p is infinite).
                      Catch{Property::kDropout, "planted-dropout-inv-p"},
                      // Custom masks: bits against dense of the same pattern; partial blocks
                      // against the custom mask alone.
                      Catch{Property::kMasks, "planted-mask-bits-stride"},
                      Catch{Property::kMasks, "planted-block-partial-full"},
                      // Per-head fp8 descales: k's folded into q's (every k descale 1)
                      // against k's read at the query head.
                      Catch{Property::kVariants, "planted-head-descale-qhead", Pass::kFwd, AF_DTYPE_FP8_E4M3},
                      // MLA (issue 28 item 5): V a view of K against V copied out.
                      Catch{Property::kKvShared, "planted-mla-v-stride-dv"},
                      // Backward: batch / head with dK / dV summed over a GQA group;
                      // thread orders on the backward launch.
                      Catch{Property::kBatchHead, "planted-bwd-gqa-one-head", Pass::kBwd},
                      Catch{Property::kDeterminism, "planted-bwd-no-ds-barrier", Pass::kBwd}),
    catch_name);

}  // namespace
}  // namespace attnfuzz::props
