// classify_test.cpp - each detector on a small hand-made kernel (tests/check/detector_kernels.hip), the
// report parsers, and TSan end to end.
#include "check/classify.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/detectors/detectors.h"
#include "check/runner.h"
#include "../core/text_case.h"

namespace attnfuzz {
namespace {

void load() {
  static std::once_flag once;
  std::call_once(once, [] {
    Registry::global().load_plugin(DETECTOR_PLUGIN);
    Registry::global().load_plugin(PLANTED_PLUGIN);
  });
}

const KernelEntry& kernel(const std::string& name) {
  load();
  const KernelEntry* e = Registry::global().find(Backend::kCpu, name);
  if (!e) throw std::runtime_error(name + " not registered");
  return *e;
}

Device& device(ThreadOrder order = ThreadOrder::kForward) {
  static std::map<ThreadOrder, std::unique_ptr<Device>> devs;
  auto& d = devs[order];
  if (!d) {
    DeviceOptions o;
    o.order = order;
    o.order_seed = 7;
    o.workers = 1;
    d = open_device("cpu", o);
  }
  return *d;
}

// In-process launches (no fork per launch), one worker thread: how a campaign worker runs (attn-fuzz's
// --isolate auto), where launches of different cases follow each other in one process.
Device& inproc_device(ThreadOrder order) {
  static std::map<ThreadOrder, std::unique_ptr<Device>> devs;
  auto& d = devs[order];
  if (!d) {
    DeviceOptions o;
    o.order = order;
    o.order_seed = 7;
    o.workers = 1;
    o.isolate = false;
    d = open_device("cpu", o);
  }
  return *d;
}

Case make(int64_t sq, int64_t sk, int64_t d, const char* mask, const char* dist = "uniform:1",
          const char* special = "", uint64_t seed = 1) {
  return test_util::text_case(make_problem(1, 1, 1, sq, sk, d, d), mask, dist, special, seed);
}

struct Outcome {
  CheckResult r;
  ClassifyStats stats;
  std::string evidence;  // every evidence line
  bool has(const std::string& detector) const {
    return evidence.find("\n" + detector + ": ") != std::string::npos;
  }
};

Outcome run(const std::string& name, const Case& c, ThreadOrder order = ThreadOrder::kForward,
            ClassifyOptions co = {}) {
  PreparedCase pc(c);
  RunOptions ro;
  Judged j = check_case(device(order), kernel(name), pc, ro);
  Outcome o;
  o.stats = classify_failure(device(order), kernel(name), pc, ro, j, co);
  o.r = j.result;
  for (const Evidence& e : o.r.evidence) o.evidence += "\n" + e.detector + ": " + e.detail;
  return o;
}

#define EXPECT_CLASS(o, cls)                                                              \
  do {                                                                                    \
    EXPECT_EQ((o).r.verdict, Verdict::kFail) << (o).r.reason << (o).evidence;             \
    EXPECT_STREQ(failure_class_name((o).r.failure), cls) << (o).r.reason << (o).evidence; \
  } while (0)

TEST(Classify, CorrectKernelPassesEverywhere) {
  for (const char* mask : {"none", "causal-tl", "causal-br", "window:3,1-br"})
    for (ThreadOrder order : {ThreadOrder::kForward, ThreadOrder::kReverse, ThreadOrder::kShuffle}) {
      const Outcome o = run("det-correct", make(9, 21, 16, mask, "uniform:1", "nan@k:masked*2"), order);
      EXPECT_EQ(o.r.verdict, Verdict::kPass) << mask << o.r.reason;
      EXPECT_FALSE(o.stats.ran);
    }
}

TEST(Classify, ReorderFindsAMissingRescale) {
  const Outcome o = run("det-no-rescale", make(4, 40, 16, "none"));
  EXPECT_CLASS(o, "rescale");
  EXPECT_TRUE(o.has("reorder")) << o.evidence;
  EXPECT_EQ(o.stats.decided_by, "reorder");
  EXPECT_NE(o.evidence.find("max key first -> err/bound"), std::string::npos);
}

// A kernel that never loads a row's last partial key tile: the row equals attention over its first 32 of 37 keys.
// The reorder experiment cannot tell that from a missing rescale (or calls it precision), the padding experiments
// leave the row's keys as they are; the keys probe names it, with where the ignored keys start.
TEST(Classify, ARowMissingItsLastKeysIsMaskByTheKeysProbe) {
  const Outcome o = run("det-drop-last-tile", make(4, 37, 16, "none"));
  EXPECT_CLASS(o, "mask");
  EXPECT_EQ(o.stats.decided_by, "keys");
  EXPECT_NE(o.evidence.find("4 of 4 failing row(s) tested miss their last keys"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("first 32 of 37 keys"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("keys from 32 on reached neither O nor the sum"), std::string::npos) << o.evidence;
  // Under a causal mask the rows lose different keys (row 36 its keys 32-36, rows < 17 nothing): each row says so.
  const Outcome c = run("det-drop-last-tile", make(40, 40, 16, "causal-tl"));
  EXPECT_CLASS(c, "mask");
  EXPECT_EQ(c.stats.decided_by, "keys") << c.evidence;
  // A missing rescale matches no prefix of the row's keys: the probe leaves it to the reorder experiment.
  const Outcome r = run("det-no-rescale", make(4, 40, 16, "none"));
  EXPECT_NE(r.evidence.find("0 of 4 failing row(s) tested match a prefix of their keys"), std::string::npos)
      << r.evidence;
}

TEST(Classify, OtherMaskOracleMatchesAKernelThatIgnoresTheMask) {
  const Outcome o = run("det-ignore-mask", make(8, 8, 16, "causal-tl"));
  EXPECT_CLASS(o, "mask");
  EXPECT_NE(o.evidence.find("under mask none"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("K and V set to NaN"), std::string::npos) << o.evidence;  // the perturbation too
}

TEST(Classify, MaskedNaNReachingTheOutputIsMask) {
  const Outcome o = run("det-ignore-mask", make(8, 8, 16, "causal-tl", "uniform:1", "nan@k:masked*2"));
  EXPECT_CLASS(o, "mask");
  EXPECT_NE(o.evidence.find("masked positions reaches the output"), std::string::npos) << o.evidence;
}

TEST(Classify, FullyMaskedRowNotZeroIsEmptyRow) {
  const Outcome o = run("det-masked-row-nan", make(9, 4, 16, "causal-br"));
  EXPECT_CLASS(o, "empty-row");
  EXPECT_EQ(o.stats.decided_by, "empty-row");
  EXPECT_NE(
      o.evidence.find("5 of 5 empty (b, h, row)s (no key of positive weight: no visible key under mask"),
      std::string::npos)
      << o.evidence;
  EXPECT_NE(o.evidence.find("5 x O NaN (0 / 0"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("rows: 5 failing (b, h, row)s: 5 empty row(s)"), std::string::npos) << o.evidence;
}

// Issue 30 (H200 smoke, jax-xla-bool-mask 129x127 causal-br): masked keys of weight 0 that P.V still multiplies
// (a NaN there would leak) and empty rows that average V. On finite inputs only the empty rows fail: empty-row,
// not mask (the NaN-in-masked-K/V probe changes rows with keys only through 0 x NaN: V = 256 there changes none).
TEST(Classify, EmptyRowsThatAverageVAreEmptyRowThoughMaskedNaNLeaks) {
  const Outcome o = run("det-big-neg-mask", make(9, 4, 16, "causal-br"));
  EXPECT_CLASS(o, "empty-row");
  EXPECT_NE(o.evidence.find("K and V set to NaN"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("changed none of them: the masked keys get weight 0"), std::string::npos) << o.evidence;
}

// Issue 11: an empty row in a case without a mask (Sk = 0) is empty-row, never mask, and no evidence
// speaks of a fully masked row next to visible keys.
TEST(Classify, EmptyRowWithoutMaskIsNeverMask) {
  const Outcome o = run("det-masked-row-nan", make(3, 0, 16, "none"));
  EXPECT_CLASS(o, "empty-row");
  EXPECT_NE(o.evidence.find("Sk = 0"), std::string::npos) << o.evidence;
  EXPECT_EQ(o.evidence.find("\nmask: "), std::string::npos) << o.evidence;
  EXPECT_EQ(o.evidence.find("fully masked"), std::string::npos) << o.evidence;
}

TEST(Classify, EmptyRowWithAFiniteLseSaysWhatWasWritten) {
  const Outcome o = run("planted-masked-score-finite", make(9, 4, 16, "causal-br"));
  EXPECT_CLASS(o, "empty-row");
  EXPECT_NE(o.evidence.find("O = 0 but LSE not -inf"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("finite stand-in for -inf"), std::string::npos) << o.evidence;
  // The non-finite evidence names the LSE, not an O element that matches.
  EXPECT_NE(o.evidence.find("non-finite: 5 (b, h, row)s"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("; LSE[b=0,h=0,s=0]: expected -inf got -1e+30 (O of this row within bound)"),
            std::string::npos)
      << o.evidence;
  EXPECT_EQ(o.evidence.find("O[b=0,s=0,h=0,d=0]: expected 0 got 0"), std::string::npos) << o.evidence;
}

// Found by a campaign: NaN keys at masked positions and an empty row with a finite LSE were called mask
// ("a NaN/Inf at masked positions reaches the output") although no NaN reached the output.
TEST(Classify, EmptyRowWithMaskedNaNKeysIsStillEmptyRow) {
  const Outcome o = run("planted-masked-score-finite", make(9, 4, 16, "causal-br", "uniform:1", "nan@k:masked*3"));
  EXPECT_CLASS(o, "empty-row");
  EXPECT_EQ(o.evidence.find("masked positions reaches the output"), std::string::npos) << o.evidence;
}

TEST(Classify, UnwrittenElementsKeepTwoPoisons) {
  const Outcome o = run("planted-last-q-tile-unstored", make(20, 16, 32, "none"));
  EXPECT_CLASS(o, "unwritten");
  EXPECT_EQ(o.stats.decided_by, "unwritten");
  EXPECT_NE(o.evidence.find("128 O element(s) and 4 LSE element(s) keep the pre-launch poison under both "
                            "0x7fbeefed (nan) and 0xc4d1a5e7 (-1677.18): never written"),
            std::string::npos)
      << o.evidence;
  EXPECT_NE(o.evidence.find("last partial 16-row tile (Sq % 16 = 4)"), std::string::npos) << o.evidence;
  // The same kernel on a whole number of tiles writes everything.
  EXPECT_EQ(run("planted-last-q-tile-unstored", make(32, 16, 32, "none")).r.verdict, Verdict::kPass);
}

TEST(Classify, LseWithoutTheRowMaxIsLseWithTheRelation) {
  const Outcome o = run("planted-lse-no-max", make(8, 40, 32, "causal-br"));
  EXPECT_CLASS(o, "lse");
  EXPECT_NE(o.evidence.find("O within its bound everywhere; LSE beyond it"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("the row max is not added back"), std::string::npos) << o.evidence;
  EXPECT_EQ(run("planted-lse-no-max", make(8, 40, 32, "causal-br", "uniform:0.0001")).r.verdict,
            Verdict::kPass);
}

// Issue 11: a mask alignment bug that leaves rows without keys they must see (O = 0, LSE = -inf where the
// exact values are finite) is mask, not non-finite, whichever of Sq and Sk is larger.
TEST(Classify, RowsWrittenEmptyByAMaskBugAreMask) {
  const Outcome sk_larger = run("det-br-sign-flip", make(4, 9, 16, "causal-br"));
  EXPECT_CLASS(sk_larger, "mask");
  EXPECT_NE(sk_larger.evidence.find("that must see keys were written as empty rows"), std::string::npos)
      << sk_larger.evidence;
  const Outcome sq_larger = run("det-always-br", make(9, 4, 16, "causal-tl"));
  EXPECT_CLASS(sq_larger, "mask");
  EXPECT_NE(sq_larger.evidence.find("that must see keys were written as empty rows"), std::string::npos)
      << sq_larger.evidence;
}

// Issue 25 item 4: the same bug in a kernel without an empty-row guard writes the rows it finds empty as
// 0 / 0 = NaN. Those rows count as the other mask's empty rows (said in the evidence), so the bug is still
// mask, not non-finite; a kernel that writes NaN for rows that are empty under every mask stays empty-row.
TEST(Classify, RowsWrittenNaNByAMaskBugAreMask) {
  const Outcome o = run("det-always-br-nan", make(9, 4, 16, "causal-tl"));
  EXPECT_CLASS(o, "mask");
  EXPECT_NE(o.evidence.find("O matches the exact result under mask causal-br"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("5 (b, h, row)s that must see keys have none under it and came out NaN"),
            std::string::npos)
      << o.evidence;
  EXPECT_CLASS(run("det-masked-row-nan", make(9, 4, 16, "causal-br")), "empty-row");
}

// Issue 11: "O matches the exact result under mask X" is never said, nor decides, on NaN = NaN.
TEST(Classify, NaNAgreementIsNotAMaskMatch) {
  Case c = make(1, 3, 8, "causal-tl", "uniform:1", "nan@k:at=1,0");
  SpecialValue sv;
  ASSERT_EQ(parse_special("nan@k:at=2,0", sv), "");
  c.values.specials.push_back(sv);
  const Outcome o = run("det-ignore-mask", c);
  EXPECT_CLASS(o, "mask");
  EXPECT_EQ(o.evidence.find("O matches the exact result"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("agree only as NaN = NaN: not a match"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("masked positions reaches the output"), std::string::npos) << o.evidence;
}

// The mask detector's gradient rule (check/detectors/mask.cpp): failing under the case's mask and passing
// with the same inputs under mask none is not proof. planted-bwd-lowp-ds-half (dS and the gradient sums in
// f16: a precision bug that applies the mask right) on a causal case whose error the mask pushes just past
// the bound (err/bound 1.08) while mask none stays under it: once called `mask`, now `precision`, with
// what was seen. The real backward mask bug (P recomputed for masked keys) is still `mask`, proven by a leak.
Case bwd_case(int64_t b, int64_t hq, int64_t hkv, int64_t s, int64_t d, const char* mask, const char* dist,
              uint64_t seed, int32_t dtype) {
  Case c = make_case(make_problem(b, hq, hkv, s, s, d, d), seed);
  EXPECT_EQ(parse_mask(mask, c.problem), "");
  EXPECT_EQ(parse_distribution(dist, c.values.dist), "");
  c.problem.dtype = dtype;
  c.pass = Pass::kBwd;
  return c;
}

TEST(Classify, BackwardPrecisionLossPastTheBoundOnlyUnderAMaskIsNotMask) {
  // attn-check --pass bwd --dtype f16 --sq 256 --sk 256 --d 8 --mask causal-br --seed 1: err/bound 1.08 under
  // causal-br, 0.24 under mask none (issue 25's eta_c term moved the earlier case, 3x2x17x16 normal:3 seed 78,
  // from 1.12 to 0.52: it passes now)
  const Outcome o =
      run("planted-bwd-lowp-ds-half", bwd_case(1, 1, 1, 256, 8, "causal-br", "uniform:1", 1, AF_DTYPE_F16));
  EXPECT_CLASS(o, "precision");
  // The old rule's premise held (so it said mask); the leak experiments found nothing.
  EXPECT_NE(o.evidence.find("pass with the same inputs under mask none"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("unmoved"), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("not proven a mask bug"), std::string::npos) << o.evidence;
}

TEST(Classify, BackwardMaskNotReappliedIsMaskByALeak) {
  for (const Case& c : {bwd_case(1, 1, 1, 33, 16, "causal-tl", "uniform:1", 1, AF_DTYPE_F32),  // the README's
                        bwd_case(3, 2, 2, 17, 16, "causal-br", "normal:3", 78, AF_DTYPE_F32)}) {
    const Outcome o = run("planted-bwd-mask-not-reapplied", c);
    EXPECT_CLASS(o, "mask");
    EXPECT_EQ(o.stats.decided_by, "mask");
    EXPECT_NE(o.evidence.find("moved"), std::string::npos) << o.evidence;
    // a row probe (dQ of rows that see none of its hidden keys) or a key probe (dK / dV of keys none of the
    // negated rows sees), whichever the failing tensor starts with
    EXPECT_TRUE(o.evidence.find("of rows that see none of them") != std::string::npos ||
                o.evidence.find("of keys none of them sees") != std::string::npos)
        << o.evidence;
  }
}

// Issue 25 item 3: a NaN at a masked key that reaches the gradients through P recomputed for masked keys
// (0 * NaN) is `mask`, its evidence naming the key and the gradient tensor, never non-finite or empty-row.
TEST(Classify, BackwardMaskedNaNReachingTheGradientsIsMaskNamingKeyAndTensor) {
  Case c = bwd_case(1, 1, 1, 33, 16, "causal-tl", "uniform:1", 1, AF_DTYPE_F32);
  SpecialValue sv;
  ASSERT_EQ(parse_special("nan@k:at=20,3", sv), "");  // key 20: masked for rows 0..19
  c.values.specials.push_back(sv);
  const Outcome o = run("planted-bwd-mask-not-reapplied", c);
  EXPECT_CLASS(o, "mask");
  EXPECT_NE(o.evidence.find("the NaN / Inf in keys j = 20 (k / v), which the mask hides, reached the gradients"),
            std::string::npos)
      << o.evidence;
  EXPECT_NE(o.evidence.find("dQ[b=0,s="), std::string::npos) << o.evidence;
  EXPECT_EQ(o.evidence.find("exp(-inf - -inf)"), std::string::npos) << o.evidence;
}

// Issue 25 item 3: the gradient leak probes start at the worst failing row / key, so the experiment looks
// where the failure is (the evidence lists that probe first).
TEST(Classify, BackwardLeakProbesStartAtTheFailingRow) {
  const Outcome o = run("planted-bwd-mask-not-reapplied", bwd_case(1, 1, 1, 33, 16, "causal-tl", "uniform:1", 1,
                                                                   AF_DTYPE_F32));
  ASSERT_FALSE(o.r.worst.empty());
  const ElementReport& w = o.r.worst.front();
  const std::string probe = w.tensor == "dQ" ? "row " + std::to_string(w.s) + " must not see"
                                             : "must not see key " + std::to_string(w.s) + " ";
  EXPECT_NE(o.evidence.find(probe), std::string::npos) << w.tensor << " " << w.s << o.evidence;
}

// Issue 11: a missing rescale on large-magnitude inputs is rescale, not precision. The worst row has keys
// of score -inf (weight 0); the reorder detector used to give up on them ("non-finite scores").
TEST(Classify, MissingRescaleWithLargeScoresAndMinusInfKeysIsRescale) {
  const Outcome o = run("planted-no-sum-rescale", make(17, 40, 16, "none", "uniform:30", "-inf@k:visible*2"));
  EXPECT_CLASS(o, "rescale");
  EXPECT_EQ(o.stats.decided_by, "reorder");
  EXPECT_LE(o.r.max_ratio, detect::kPrecisionLimit);  // it would have been called precision
  const Outcome big = run("planted-no-acc-rescale", make(17, 40, 16, "causal-br", "extreme:100", "inf@k:masked"));
  EXPECT_CLASS(big, "rescale");
}

// Issue 11: classification is deterministic: replaying a case gives the recorded verdict and class,
// whatever ran before it in the process (a campaign worker runs thousands of cases) and however many
// emulator worker threads run the blocks (campaign workers use 1, attn-check all cores).
TEST(Classify, DeterministicWhateverRanBeforeAndWorkerCount) {
  load();
  struct Run {
    unsigned workers;
    int64_t before_sk;  // a launch of another case first (0 = none)
  };
  for (const char* name : {"planted-no-score-barrier", "planted-smem-reuse-race", "planted-tail-k-oob-read"})
    for (const Case& c : {make(4, 20, 64, "none"), make(37, 33, 16, "causal-br", "uniform:2", "", 5)}) {
      std::string first;
      for (const Run& run : {Run{1, 0}, Run{1, 7}, Run{1, 50}, Run{2, 0}, Run{3, 9}}) {
        DeviceOptions o;
        o.order = ThreadOrder::kShuffle;
        o.order_seed = 7;
        o.workers = run.workers;
        o.isolate = false;  // as in a campaign worker
        auto dev = open_device("cpu", o);
        RunOptions ro;
        if (run.before_sk) {
          PreparedCase other(make(16, run.before_sk, 64, "none", "uniform:5", "", 99));
          check_case(*dev, kernel(name), other, ro);
        }
        PreparedCase pc(c);
        Judged j = check_case(*dev, kernel(name), pc, ro);
        classify_failure(*dev, kernel(name), pc, ro, j);
        const std::string got = std::string(verdict_name(j.result.verdict)) + " " +
                                failure_class_name(j.result.failure) + " " + std::to_string(j.result.failed);
        if (first.empty()) first = got;
        EXPECT_EQ(got, first) << name << " " << describe(c) << " workers " << run.workers << " after Sk="
                              << run.before_sk;
      }
    }
}

// The root of the nondeterminism: __shared__ is thread_local on the emulator, and with one worker the
// blocks ran on the calling thread, so a racy kernel's first reads saw what the previous launch (another
// case) left there. Each launch now runs on a fresh thread: the same case gives the same bits whatever
// ran before.
TEST(Classify, ALaunchDoesNotSeeEarlierLaunchesSharedMemory) {
  const KernelEntry& k = kernel("det-no-barrier");
  RunOptions ro;
  std::vector<float> first;
  for (int64_t before_sk : {3, 20, 64}) {
    PreparedCase other(make(2, before_sk, 16, "none", "uniform:7", "", 3));
    check_case(inproc_device(ThreadOrder::kReverse), k, other, ro);
    PreparedCase pc(make(4, 20, 16, "none"));
    const Judged j = check_case(inproc_device(ThreadOrder::kReverse), k, pc, ro);
    if (first.empty()) first = j.outcome.o;
    ASSERT_EQ(j.outcome.o.size(), first.size());
    EXPECT_EQ(std::memcmp(j.outcome.o.data(), first.data(), first.size() * 4), 0) << "after Sk=" << before_sk;
  }
}

// Issue 11: the evidence lists every kind of wrong row with counts, not only the first finding. Bottom-right
// taken as top-left with Sq > Sk: the 6 empty rows see keys, and the 6 rows with keys see the wrong ones.
TEST(Classify, EvidenceCountsEveryKindOfWrongRow) {
  const Outcome o = run("planted-causal-top-left", make(13, 7, 16, "causal-br"));
  EXPECT_CLASS(o, "mask");
  EXPECT_NE(o.evidence.find("rows: 12 failing (b, h, row)s: 6 empty row(s) (no key of positive weight) not O = 0 / "
                            "LSE = -inf, 6 row(s) with keys and finite O beyond the bound"),
            std::string::npos)
      << o.evidence;
  // The non-finite evidence names the LSE of an empty row and says that its O is wrong too.
  EXPECT_NE(o.evidence.find("LSE[b=0,h=0,s=0]: expected -inf got "), std::string::npos) << o.evidence;
  EXPECT_NE(o.evidence.find("(O of this row finite, but beyond its bound); row empty (exact O = 0, LSE = -inf), no "
                            "visible key"),
            std::string::npos)
      << o.evidence;
}

TEST(Classify, FarBeyondTheBoundWithNoSignatureIsWrong) {
  const Outcome o = run("det-far-off", make(5, 19, 16, "causal-br"));
  EXPECT_CLASS(o, "wrong");
  EXPECT_EQ(o.stats.decided_by, "wrong");
  EXPECT_GT(o.r.max_ratio, detect::kPrecisionLimit);
  EXPECT_NE(o.evidence.find("far beyond the bound"), std::string::npos) << o.evidence;
}

// The score scale: a kernel that ignores the given scale (1/sqrt(D) instead of 0.5) is ignored-parameter; an exp2
// softmax that misses log2 e is named by its relation and keeps its magnitude's class; an imprecise kernel matches
// no other scale and stays precision.
Case with_scale(Case c, float scale) {
  c.problem.scale = scale;
  return c;
}

TEST(Classify, AGivenScaleThatIsIgnoredIsAnIgnoredParameter) {
  const Outcome o = run("det-scale-default", with_scale(make(5, 19, 16, "causal-br", "uniform:3"), 0.5f));
  EXPECT_CLASS(o, "ignored-parameter");
  EXPECT_EQ(o.r.decided_by, "scale/default");
  EXPECT_NE(o.evidence.find("the kernel ignores the score scale (problem.scale = 0.5): the output is the attention "
                            "with the default 1/sqrt(D) = 0.25"),
            std::string::npos)
      << o.evidence;
}

TEST(Classify, AnExp2SoftmaxWithoutLog2eIsNamedByItsScale) {
  const Outcome o = run("det-exp2-no-log2e", make(5, 19, 16, "causal-br", "uniform:3"));
  EXPECT_EQ(o.r.verdict, Verdict::kFail);
  EXPECT_EQ(o.r.decided_by, "scale/exp2-no-log2e") << o.evidence;
  EXPECT_STREQ(failure_class_name(o.r.failure), o.r.max_ratio > detect::kPrecisionLimit ? "wrong" : "precision");
  EXPECT_NE(o.evidence.find("an exp2 softmax whose scores miss the log2 e factor"), std::string::npos) << o.evidence;
  const Outcome sloppy = run("det-sloppy", make(5, 19, 16, "causal-br", "uniform:3"));
  EXPECT_CLASS(sloppy, "precision");
  EXPECT_EQ(sloppy.r.decided_by, "precision");
  EXPECT_NE(sloppy.evidence.find("scale: not another score scale"), std::string::npos) << sloppy.evidence;
}

// Issue 11: a barrier race is not oob-read. The check runs after a launch of another case, so the racy
// kernel's first reads see another launch's shared memory; the poison swap must prove determinism first.
TEST(Classify, BarrierRaceIsNotOobReadAfterAnotherLaunch) {
  const KernelEntry& k = kernel("det-no-barrier");
  RunOptions ro;
  for (int64_t other_sk : {5, 33}) {
    PreparedCase other(make(2, other_sk, 16, "none", "uniform:3", "", 9));
    Device& dev = inproc_device(ThreadOrder::kReverse);
    check_case(dev, k, other, ro);
    PreparedCase pc(make(4, 20, 16, "none"));
    Judged j = check_case(dev, k, pc, ro);
    const ClassifyStats st = classify_failure(dev, k, pc, ro, j);
    std::string ev;
    for (const Evidence& e : j.result.evidence) ev += "\n" + e.detector + ": " + e.detail;
    EXPECT_EQ(j.result.verdict, Verdict::kFail) << ev;
    EXPECT_STREQ(failure_class_name(j.result.failure), "barrier-race") << ev;
    EXPECT_NE(st.decided_by, "poison-swap") << ev;
  }
}

TEST(Classify, PoisonSwapFindsAnOutOfBoundsRead) {
  const Outcome o = run("det-read-past-end", make(4, 9, 16, "none"));
  EXPECT_CLASS(o, "oob-read");
  EXPECT_EQ(o.stats.decided_by, "poison-swap");
  EXPECT_EQ(o.stats.launches, 2);  // a rerun under the same poison (determinism), then the swap
  EXPECT_NE(o.evidence.find("deterministic under one poison"), std::string::npos) << o.evidence;
}

TEST(Classify, PoisonSwapReusesIdenticalReruns) {
  ClassifyOptions co;
  co.cpu_reruns = 2;  // as on a GPU: bitwise reruns first; then the swap needs no determinism rerun of its own
  const Outcome o = run("det-read-past-end", make(4, 9, 16, "none"), ThreadOrder::kForward, co);
  EXPECT_CLASS(o, "oob-read");
  EXPECT_EQ(o.stats.launches, 3);
  EXPECT_NE(o.evidence.find("2 bitwise reruns are identical"), std::string::npos) << o.evidence;
}

TEST(Classify, CanariesFindAnOutOfBoundsWriteAndNothingElseRuns) {
  const Outcome o = run("det-write-past-end", make(3, 5, 16, "none"));
  EXPECT_CLASS(o, "oob-write");
  EXPECT_TRUE(o.has("canary")) << o.evidence;
  EXPECT_FALSE(o.stats.ran);
}

TEST(Classify, ThreadOrdersFindABarrierRace) {
  // Thread 0 runs first in forward order: the race is silent there and shows in reverse.
  EXPECT_EQ(run("det-no-barrier", make(4, 20, 16, "none")).r.verdict, Verdict::kPass);
  const Outcome o = run("det-no-barrier", make(4, 20, 16, "none"), ThreadOrder::kReverse);
  EXPECT_CLASS(o, "barrier-race");
  EXPECT_EQ(o.stats.decided_by, "schedule");
  EXPECT_NE(o.evidence.find("forward pass"), std::string::npos) << o.evidence;
}

TEST(Classify, NonFiniteEvidenceNamesExtremeInputs) {
  const Outcome o = run("det-no-max-sub", make(8, 40, 32, "none", "extreme:100"));
  EXPECT_CLASS(o, "non-finite");
  EXPECT_NE(o.evidence.find("extreme: exp(score) overflows"), std::string::npos) << o.evidence;
}

// ---- custom masks (issue 28): empty-row, non-finite, tail and reorder read visibility through the one rule
// ----
Case masked(Case c, uint32_t bits, const char* pattern) {
  EXPECT_EQ(set_mask_variants(c, bits, pattern), "");
  EXPECT_EQ(validate(c), "") << describe(c);
  return c;
}

TEST(Classify, ARowTheCustomMaskHidesEntirelyIsAnEmptyRow) {
  const Case c = masked(make(12, 20, 16, "none"), AF_VARIANT_MASK_DENSE, "rows:0.6");
  EXPECT_EQ(run("det-correct", c).r.verdict, Verdict::kPass);
  const Outcome o = run("det-masked-row-nan", c);
  EXPECT_CLASS(o, "empty-row");
  EXPECT_EQ(o.stats.decided_by, "empty-row");
  EXPECT_NE(o.evidence.find("no visible key (the custom / block mask hides all of [0, 20))"),
            std::string::npos)
      << o.evidence;
}

TEST(Classify, ReorderMovesOnlyTheKeysACustomMaskShows) {
  const Case c = masked(make(4, 40, 16, "none"), AF_VARIANT_MASK_BITS, "random:0.7");
  EXPECT_EQ(run("det-correct", c).r.verdict, Verdict::kPass);
  const Outcome o = run("det-no-rescale", c);
  EXPECT_CLASS(o, "rescale");
  EXPECT_EQ(o.stats.decided_by, "reorder");
  EXPECT_NE(o.evidence.find("(the custom / block mask hides the other"), std::string::npos) << o.evidence;
}

TEST(Classify, TailPadsACustomMaskInItsDenseForm) {
  // Bits and blocks: the unpadded case as one dense mask still fails (the control), then Sk 37 -> 40 with the
  // new keys hidden passes.
  Case c = masked(make(8, 37, 16, "none"), AF_VARIANT_MASK_BITS | AF_VARIANT_BLOCK_SPARSE, "random:0.8");
  EXPECT_EQ(run("det-correct", c).r.verdict, Verdict::kPass);
  const Outcome o = run("det-tail-last-key", c);
  EXPECT_CLASS(o, "tail");
  EXPECT_NE(o.evidence.find("control: the custom / block masks as one dense mask (nothing padded): FAIL"),
            std::string::npos)
      << o.evidence;
  EXPECT_NE(o.evidence.find("pass after Sk 37 -> 40"), std::string::npos) << o.evidence;
}

TEST(Classify, NonFiniteEvidenceCountsKeysTheCustomMaskHidesAsMasked) {
  const Outcome o = run("det-no-max-sub",
                        masked(make(8, 40, 32, "none", "extreme:100"), AF_VARIANT_MASK_DENSE, "random:0.5"));
  EXPECT_CLASS(o, "non-finite");
  EXPECT_NE(o.evidence.find("keys visible in [0, 40) (the custom / block mask hides the other"),
            std::string::npos)
      << o.evidence;
}

TEST(Classify, PrecisionWhenNoSignatureApplies) {
  const Outcome o = run("det-sloppy", make(5, 19, 16, "causal-br"));
  EXPECT_CLASS(o, "precision");
  EXPECT_TRUE(o.has("precision")) << o.evidence;
  EXPECT_LE(o.r.max_ratio, detect::kPrecisionLimit);
  EXPECT_TRUE(o.has("poison-swap") && o.has("schedule") && o.has("reorder")) << o.evidence;
}

TEST(Classify, DisabledKeepsTheFirstClass) {
  ClassifyOptions co;
  co.enabled = false;
  const Outcome o = run("det-read-past-end", make(4, 9, 16, "none"), ThreadOrder::kForward, co);
  EXPECT_CLASS(o, "non-finite");
  EXPECT_FALSE(o.stats.ran);
}

TEST(Classify, TsanMissingBinaryIsEvidenceNotAnError) {
  ClassifyOptions co;
  co.tsan = true;
  co.tsan_binary = "/nonexistent/attn-check";
  const Outcome o = run("det-no-barrier", make(4, 20, 16, "none"), ThreadOrder::kReverse, co);
  EXPECT_CLASS(o, "barrier-race");
  EXPECT_NE(o.evidence.find("tsan: not run: no ThreadSanitizer build"), std::string::npos) << o.evidence;
}

TEST(Classify, PrecedenceIsDocumentedOrder) {
  std::string names;
  for (FailureClass c : class_precedence()) names += std::string(failure_class_name(c)) + " ";
  EXPECT_EQ(names,
            "oob-write unwritten oob-read barrier-race dropout ignored-parameter mask empty-row merge split-kv tail lse "
            "rescale non-finite precision wrong ");
}

// ---- report parsers ----

TEST(TsanParser, ReadsBothAccessesAndLines) {
  const std::string text = R"(==================
WARNING: ThreadSanitizer: data race (pid=4242)
  Read of size 4 at 0x7b0400000010 by main thread:
    #0 (anonymous namespace)::row_kernel<(Bug)5>(af_problem, float const*) /src/tests/check/detector_kernels.hip:59 (libx.so+0x1234)
    #1 hipemu::fiber_entry(boost::context::detail::transfer_t) /src/runtime/cpu/emulator.cpp:140 (attn-check+0x99)

  Previous write of size 4 at 0x7b0400000010 by main thread:
    #0 (anonymous namespace)::row_kernel<(Bug)5>(af_problem, float const*) /src/tests/check/detector_kernels.hip:56 (libx.so+0x1200)

  Location is TLS of main thread.

SUMMARY: ThreadSanitizer: data race /src/tests/check/detector_kernels.hip:59 in row_kernel
==================
)";
  const auto races = parse_tsan_report(text);
  ASSERT_EQ(races.size(), 1u);
  EXPECT_EQ(races[0].access, "read of size 4");
  EXPECT_EQ(races[0].previous_access, "write of size 4");
  EXPECT_EQ(races[0].site, "detector_kernels.hip:59");
  EXPECT_EQ(races[0].previous_site, "detector_kernels.hip:56");
  EXPECT_EQ(races[0].variable, "TLS of main thread.");  // file not readable here: TSan's own words
}

// The 1-based line of the first line of `path` containing `needle` (0 if none).
int line_of(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.find(needle) != std::string::npos) return n;
  return 0;
}

TEST(TsanParser, NamesTheSharedVariableFromTheSource) {
  const std::string src = std::string(DETECTOR_SOURCE);
  const int read = line_of(src, "const float alpha = coef[0]"), write = line_of(src, "coef[0] = alpha;");
  ASSERT_GT(read, 0);
  ASSERT_GT(write, 0);
  const std::string text =
      "WARNING: ThreadSanitizer: data race (pid=1)\n  Read of size 4 at 0x1 by main thread:\n"
      "    #0 f " +
      src + ":" + std::to_string(read) +
      " (x+0x1)\n  Previous write of size 4 at 0x1 by main thread:\n"
      "    #0 f " +
      src + ":" + std::to_string(write) +
      " (x+0x2)\n  Location is TLS of main thread.\n"
      "SUMMARY: ThreadSanitizer: data race\n";
  const auto races = parse_tsan_report(text);
  ASSERT_EQ(races.size(), 1u);
  EXPECT_EQ(races[0].variable, "__shared__ coef") << describe(races[0]);
  EXPECT_NE(races[0].code.find("coef"), std::string::npos);
}

TEST(ComputeSanitizerParser, CountsErrorsAndKeepsFindings) {
  const std::string text = R"(========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at k(float*)+0x1f0 in a.hip:52
=========     and Read access at k(float*)+0x2a0 in a.hip:61 [128 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
========= ERROR SUMMARY: 1 error
)";
  const SanitizerReport r = parse_compute_sanitizer("racecheck", text);
  EXPECT_EQ(r.errors, 1);
  ASSERT_FALSE(r.findings.empty());
  EXPECT_NE(r.findings[0].find("Race reported"), std::string::npos);
  const SanitizerReport m = parse_compute_sanitizer(
      "memcheck",
      "========= Invalid __global__ write of size 4 bytes\n=========     at k+0x70 in b.hip:9\n"
      "========= ERROR SUMMARY: 3 errors\n");
  EXPECT_EQ(m.errors, 3);
  ASSERT_EQ(m.findings.size(), 1u);
  EXPECT_NE(m.findings[0].find("b.hip:9"), std::string::npos);
  // What racecheck printed on an H200 (CUDA 13) for planted-smem-reuse-race: no ERROR SUMMARY line, and
  // the hazard is a warning.
  const SanitizerReport w = parse_compute_sanitizer(
      "racecheck",
      "========= Warning: Race reported between Read access at k+0x2440\n"
      "=========     and Write access at k+0x2470 [16 hazards]\n"
      "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)\n");
  EXPECT_EQ(w.errors, 1);
}

// ---- ThreadSanitizer end to end (needs the tsan build: cmake --preset tsan; skipped without it) ----

std::string tsan_binary() {
  if (const char* e = std::getenv("ATTNFUZZ_TSAN_ATTN_CHECK")) return e;
  return TSAN_ATTN_CHECK;
}

TEST(TsanBuild, BarrierRemovedKernelsAreReportedWithVariableAndLines) {
  if (!std::filesystem::exists(tsan_binary())) GTEST_SKIP() << "no TSan attn-check at " << tsan_binary();
  ClassifyOptions co;
  co.tsan = true;
  co.tsan_binary = tsan_binary();
  co.plugins = {PLANTED_PLUGIN};
  struct Bug {
    const char* kernel;
    Case c;
    ThreadOrder order;
    const char* variable;
    const char* file;
  } bugs[] = {{"planted-no-score-barrier", make(4, 20, 64, "none"), ThreadOrder::kReverse, "coef",
               "online_row_bugs.hip:"},
              {"planted-smem-reuse-race", make(4, 100, 16, "none"), ThreadOrder::kForward, "red",
               "materialized_bugs.hip:"}};
  for (const Bug& b : bugs) {
    const Outcome o = run(b.kernel, b.c, b.order, co);
    EXPECT_CLASS(o, "barrier-race");
    EXPECT_NE(o.evidence.find(std::string("tsan: data race on __shared__ ") + b.variable), std::string::npos)
        << o.evidence;
    EXPECT_NE(o.evidence.find(b.file), std::string::npos) << o.evidence;
    std::cout << b.kernel << ":" << o.evidence << "\n";
  }
}

// Correct kernels under the TSan build: no report at all, neither on kernel data nor on the emulator's own
// (its fiber switches carry no synchronisation, so every access it shares between fibers is atomic or
// ordered by a barrier's or the block's set-up's release / acquire pair).
TEST(TsanBuild, CorrectKernelsReportNoRace) {
  if (!std::filesystem::exists(tsan_binary())) GTEST_SKIP() << "no TSan attn-check at " << tsan_binary();
  const std::string out = (std::filesystem::temp_directory_path() / "attnfuzz-tsan-correct").string();
  for (const char* order : {"shuffle"}) {  // ~25x slower than a plain run: one order, one case
    std::string text;
    const int rc = detect::run_command(
        "TSAN_OPTIONS=halt_on_error=0 " + tsan_binary() +
            " --kernel all --sq 17 --sk 20 --d 8 --mask causal-br --no-isolate --workers 1 --no-reports "
            "--oracle-rows 1 --no-classify --quiet --order " +
            order + " --out " + out,
        600, text);
    EXPECT_EQ(rc, 0) << text.substr(0, 4000);
    for (const TsanRace& r : parse_tsan_report(text)) ADD_FAILURE() << order << ": " << describe(r);
  }
}

}  // namespace
}  // namespace attnfuzz
