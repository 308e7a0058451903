// splitkv_tail_test.cpp - the split-kv and tail detectors: exact paddings, evidence, tunables in case files.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/classify.h"
#include "check/detectors/detectors.h"
#include "check/runner.h"

namespace attnfuzz {
namespace {

void load() {
  static std::once_flag once;
  std::call_once(once, [] { Registry::global().load_plugin(PLANTED_PLUGIN); });
}

Device& device() {
  static std::unique_ptr<Device> d = open_device("cpu", DeviceOptions{});
  return *d;
}

const KernelEntry& kernel(const std::string& name) {
  load();
  const KernelEntry* e = Registry::global().find(Backend::kCpu, name);
  if (!e) throw std::runtime_error(name + " is not registered");
  return *e;
}

Case make(int64_t sq, int64_t sk, int64_t d, const std::string& mask, uint64_t seed = 3) {
  Problem p = make_problem(1, 1, 1, sq, sk, d, d);
  EXPECT_EQ(parse_mask(mask, p), "");
  return make_case(p, seed);
}

std::string evidence(const CheckResult& r) {
  std::string s;
  for (const Evidence& e : r.evidence) s += e.detector + ": " + e.detail + "\n";
  return s;
}

// Checks and classifies; returns the classified result.
CheckResult classify(const std::string& name, const Case& c) {
  PreparedCase pc(c);
  RunOptions ro;
  Judged j = check_case(device(), kernel(name), pc, ro);
  EXPECT_EQ(j.result.verdict, Verdict::kFail) << name << " on " << describe(c);
  classify_failure(device(), kernel(name), pc, ro, j, ClassifyOptions{});
  return j.result;
}

// Every padding the tail detector may use keeps each original row's exact O and LSE (the oracle of the padded
// case, read at the shifted places, equals the original oracle), under every mask form and alignment.
TEST(TailPaddings, KeepTheExactResult) {
  const char* masks[] = {"none",          "causal-tl",       "causal-br",        "window:5,3-br",
                         "window:2,0-tl", "window:inf,3-br", "window:16,inf-tl", "window:0,0-br"};
  const int64_t shapes[][3] = {{1, 13, 7}, {7, 13, 59}, {13, 7, 17}, {5, 37, 3}, {37, 37, 33}};
  int checked = 0, sq_pads = 0, sk_pads = 0, d_pads = 0;
  for (auto [sq, sk, d] : shapes)
    for (const char* mask : masks) {
      Case c = make(sq, sk, d, mask, static_cast<uint64_t>(sq * 100 + sk));
      c.problem.scale = 0.3f;  // not the default of any D: the padded problems must keep it
      const Tensors t = generate(c);
      const OracleResult ex = compute_oracle(c.problem, t.q.data(), t.k.data(), t.v.data());
      for (const detect::TailPadding& x : detect::tail_paddings(c.problem, nullptr)) {
        if (!x.refused.empty()) continue;
        SCOPED_TRACE(describe(c.problem) + " / " + x.what);
        ASSERT_EQ(validate(x.p), "");
        ASSERT_EQ(x.p.scale, c.problem.scale);
        (x.axis == "Sq" ? sq_pads : x.axis == "Sk" ? sk_pads : d_pads)++;
        const Tensors t2 = detect::tail_pad_tensors(c.problem, t, x);
        const OracleResult ex2 = compute_oracle(x.p, t2.q.data(), t2.k.data(), t2.v.data());
        for (int64_t s = 0; s < sq; ++s) {
          const double a = ex.lse[ex.lse_at(0, 0, s)], b = ex2.lse[ex2.lse_at(0, 0, s + x.q_shift)];
          ASSERT_TRUE(a == b || std::fabs(a - b) <= 1e-12 * (1 + std::fabs(a))) << "LSE row " << s;
          for (int64_t dd = 0; dd < d; ++dd) {
            const double o1 = ex.o[ex.o_at(0, s, 0, dd)], o2 = ex2.o[ex2.o_at(0, s + x.q_shift, 0, dd)];
            ASSERT_LE(std::fabs(o1 - o2), 1e-12 * (1 + std::fabs(o1))) << "O row " << s << " d " << dd;
          }
        }
        ++checked;
      }
    }
  EXPECT_GT(d_pads, 0);
  EXPECT_GT(sq_pads, 0);
  EXPECT_GT(sk_pads, 0);  // key paddings exist for masks that can hide keys (causal, windows, decode)
  std::cout << "[ paddings ] " << checked << " exact paddings (" << d_pads << " D, " << sq_pads << " Sq, "
            << sk_pads << " Sk)\n";
}

// No mask can hide appended or prepended keys from every row of a multi-row unmasked case: the detector
// says so instead of using an inexact padding.
TEST(TailPaddings, RefusesKeyPaddingsThatWouldChangeTheResult) {
  const Case c = make(7, 13, 16, "none");
  for (const detect::TailPadding& x : detect::tail_paddings(c.problem, nullptr))
    if (x.axis == "Sk") EXPECT_NE(x.refused, "") << x.what;
  // With one query row a window can.
  bool decode = false;
  for (const detect::TailPadding& x : detect::tail_paddings(make(1, 13, 16, "none").problem, nullptr))
    decode |= x.axis == "Sk" && x.refused.empty();
  EXPECT_TRUE(decode);
}

TEST(SplitKvDetector, NamesTheSplitCountsThatFailAndPass) {
  const CheckResult r = classify("planted-combine-drops-last-split", make(4, 37, 32, "none"));
  const std::string ev = evidence(r);
  EXPECT_EQ(failure_class_name(r.failure), std::string("split-kv")) << ev;
  EXPECT_NE(ev.find("num_splits 8 (as checked): FAIL"), std::string::npos) << ev;
  EXPECT_NE(ev.find("1: pass"), std::string::npos) << ev;  // one split: nothing to drop
  EXPECT_NE(ev.find("appears or vanishes with the KV split count"), std::string::npos) << ev;
}

TEST(SplitKvDetector, SaysWhenNoSplitCountIsDeclared) {
  const CheckResult r = classify("planted-no-acc-rescale", make(33, 100, 32, "none"));
  const std::string ev = evidence(r);
  EXPECT_NE(ev.find("declares no KV-split tunable"), std::string::npos) << ev;
  EXPECT_EQ(failure_class_name(r.failure), std::string("rescale")) << ev;
}

TEST(SplitKvDetector, SilentWhenEverySplitCountFails) {
  // A head-dim bug in a split kernel fails at every split count: the detector must not call it split-kv.
  const CheckResult r = classify("planted-headdim-unroll4", make(4, 40, 59, "none"));
  const std::string ev = evidence(r);
  EXPECT_NE(ev.find("fails at every num_splits tried"), std::string::npos) << ev;
  EXPECT_EQ(failure_class_name(r.failure), std::string("tail")) << ev;
  EXPECT_NE(ev.find("D,Dv 59,59 -> 64,64 (x8, x16, x32, x64, pow2): pass"), std::string::npos) << ev;
}

TEST(TailDetector, PartialKeyTileVanishesWithInvisibleKeys) {
  const CheckResult r = classify("planted-tail-tile-last-key", make(8, 40, 32, "causal-br"));
  const std::string ev = evidence(r);
  EXPECT_EQ(failure_class_name(r.failure), std::string("tail")) << ev;
  EXPECT_NE(ev.find("Sk 40 -> 48 (x16), mask window:inf,32-tl: pass"), std::string::npos) << ev;
  EXPECT_NE(ev.find("Sk 40 -> 64 (x32, x64, pow2), mask window:inf,32-tl: pass"), std::string::npos) << ev;
  EXPECT_NE(ev.find("D,Dv 32,32 -> 64,64"), std::string::npos) << ev;
  EXPECT_NE(ev.find("%16=8"), std::string::npos) << ev;  // the failing residue of Sk
}

// No mask hides padded keys from every row of an unmasked multi-row case: the worst row alone (Sq = 1, same
// exact result) is checked as is, then its keys are padded behind a window.
TEST(TailDetector, UnmaskedKeyTailThroughTheWorstRowAlone) {
  const CheckResult r = classify("planted-tail-tile-last-key", make(8, 40, 32, "none"));
  const std::string ev = evidence(r);
  EXPECT_EQ(failure_class_name(r.failure), std::string("tail")) << ev;
  EXPECT_NE(ev.find("alone (Sq 1): as is: FAIL"), std::string::npos) << ev;
  EXPECT_NE(ev.find("alone (Sq 1): Sk 40 -> 48 (x16), mask window:inf,39-tl: pass"), std::string::npos) << ev;
}

// A case file records the tunables it was checked with, so a failure that needs a split count replays
// exactly; files without them read back with every tunable at 0 (= the kernel's default).
TEST(Tunables, RecordedInCaseFilesForExactReplay) {
  const KernelEntry& k = kernel("planted-combine-drops-last-split");
  Case c = make(4, 40, 32, "none");  // 8 splits of 5: quiet at the default
  {
    PreparedCase pc(c);
    EXPECT_EQ(check_case(device(), k, pc, RunOptions{}).result.verdict, Verdict::kPass);
  }
  c.problem.tunables[0] = 3;  // 3 splits of 14 keys: the last (12 keys) is dropped
  CorpusFile cf;
  cf.the_case = c;
  const std::string text = to_corpus_text(cf);
  EXPECT_NE(text.find("\"tunables\""), std::string::npos);
  const CorpusFile back = parse_corpus(text);
  EXPECT_EQ(back.the_case.problem.tunables[0], 3);
  PreparedCase pc(back.the_case);
  EXPECT_EQ(check_case(device(), k, pc, RunOptions{}).result.verdict, Verdict::kFail);
  EXPECT_NE(describe(back.the_case.problem).find("tunables=3,0,0,0"), std::string::npos);

  // Absent = default: the text of a case without tunables has no such key and reads back as zeros.
  CorpusFile plain;
  plain.the_case = make(4, 40, 32, "none");
  const std::string t2 = to_corpus_text(plain);
  EXPECT_EQ(t2.find("tunables"), std::string::npos);
  for (int32_t v : parse_corpus(t2).the_case.problem.tunables) EXPECT_EQ(v, 0);

  // A negative value is a corrupt file.
  std::string bad = text;
  bad.replace(bad.find('3', bad.find("\"tunables\"")), 1, "-3");
  EXPECT_THROW(parse_corpus(bad), CorpusError);
}

}  // namespace
}  // namespace attnfuzz
