// malformed_test.cpp - the reject-or-correct judgement of malformed sequence metadata (check/runner.cpp, issue 30
// item 6a): the built-in varlen kernel refuses every defect (pass), the planted kernel that trusts its metadata is
// accepted-malformed with the defect named, and the one defect with a right answer is judged against it.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/runner.h"

namespace attnfuzz {
namespace {

Device& device() {  // forked launches: a kernel that trusts a bad page index may fault, and that is its class
  static std::unique_ptr<Device> d = open_device("cpu", DeviceOptions{});
  return *d;
}

const KernelEntry& kernel(const std::string& name) {
  static bool loaded = (Registry::global().load_plugin(PLANTED_PLUGIN), true);
  (void)loaded;
  const KernelEntry* k = Registry::global().find(Backend::kCpu, name);
  EXPECT_NE(k, nullptr) << name;
  return *k;
}

Case varlen_case(Malformed m) {  // packed q and K/V: 3, 0, 17 queries over 5, 1, 40 keys
  Case c = make_case(make_problem(3, 2, 1, 1, 1, 16, 16), 11);
  c.problem.q_layout = c.problem.kv_layout = AF_SEQ_PACKED;
  c.seqs.q = {3, 0, 17};
  c.seqs.k = {5, 1, 40};
  EXPECT_EQ(set_sequence_fields(c), "");
  c.seqs.malformed = m;
  EXPECT_EQ(validate(c), "");
  return c;
}

Case paged_case(Malformed m) {  // paged K/V: 33 and 1 keys in pages of 16 (shuffled), one spare page
  Case c = make_case(make_problem(2, 2, 1, 3, 1, 16, 16), 12);
  c.problem.kv_layout = AF_SEQ_PAGED;
  c.problem.page_size = 16;
  c.seqs.used = {33, 1};
  c.seqs.page_order = 9;
  c.seqs.spare_pages = 1;
  EXPECT_EQ(set_sequence_fields(c), "");
  c.seqs.malformed = m;
  EXPECT_EQ(validate(c), "");
  return c;
}

std::string evidence(const CheckResult& r) {
  std::string s;
  for (const Evidence& e : r.evidence) s += e.detector + ": " + e.detail + "\n";
  return s;
}

// Every defect without a right answer, in a sequence where the trusting kernel stays inside the guard zones.
std::vector<Case> no_answer_cases() {
  return {varlen_case({Malformation::kCuQDecreasing, 2}), varlen_case({Malformation::kCuKDecreasing, 1}),
          varlen_case({Malformation::kCuKPastTotal, 2}),  paged_case({Malformation::kSequsedOverCapacity, 0}),
          paged_case({Malformation::kSequsedNegative, 1}), paged_case({Malformation::kPageOutOfPool, 0}),
          paged_case({Malformation::kPageNegative, 1})};
}

TEST(MalformedMetadata, TheBuiltInVarlenKernelRefusesEveryDefect) {
  for (const Case& c : no_answer_cases()) {
    PreparedCase pc(c);
    const Judged j = check_case(device(), kernel("varlen-bm16-bn16"), pc, RunOptions{});
    EXPECT_EQ(j.result.verdict, Verdict::kPass) << describe(c) << "\n" << j.result.reason;
    EXPECT_NE(evidence(j.result).find("malformed: refused "), std::string::npos) << evidence(j.result);
  }
}

TEST(MalformedMetadata, AKernelThatTrustsItsMetadataIsAcceptedMalformedWithTheDefectNamed) {
  for (const Case& c : no_answer_cases()) {
    PreparedCase pc(c);
    const Judged j = check_case(device(), kernel("planted-varlen-trusts-metadata"), pc, RunOptions{});
    EXPECT_EQ(j.result.verdict, Verdict::kFail) << describe(c);
    EXPECT_EQ(failure_class_name(j.result.failure), std::string("accepted-malformed"))
        << describe(c) << "\n" << j.result.reason << "\n" << evidence(j.result);
    EXPECT_NE(j.result.reason.find(std::string("(") + malformation_name(c.seqs.malformed.kind) + ")"),
              std::string::npos)
        << j.result.reason;
  }
  PreparedCase pc(varlen_case({Malformation::kCuKDecreasing, 1}));
  const Judged j = check_case(device(), kernel("planted-varlen-trusts-metadata"), pc, RunOptions{});
  EXPECT_NE(j.result.reason.find("cu_seqlens_k[2] = 4 < cu_seqlens_k[1] = 5 (cu-k-decreasing)"), std::string::npos)
      << j.result.reason;
  EXPECT_EQ(j.result.decided_by, "malformed/cu-k-decreasing");
}

// The contract's other half: accepting a defect must never write out of bounds. Sequence 2 then starts a row early
// and writes one LSE row past the buffer: oob-write (it precedes accepted-malformed), the defect in the evidence.
TEST(MalformedMetadata, AnAcceptedDefectThatWritesOutOfBoundsIsOobWriteWithTheDefectInTheEvidence) {
  PreparedCase pc(varlen_case({Malformation::kCuQDecreasing, 1}));
  const Judged j = check_case(device(), kernel("planted-varlen-trusts-metadata"), pc, RunOptions{});
  EXPECT_EQ(failure_class_name(j.result.failure), std::string("oob-write")) << j.result.reason;
  EXPECT_NE(evidence(j.result).find("malformed: cu_seqlens_q[2] = 2 < cu_seqlens_q[1] = 3 (cu-q-decreasing)"),
            std::string::npos)
      << evidence(j.result);
}

TEST(MalformedMetadata, ADefectWithARightAnswerPassesWhenTheAnswerIsRight) {
  // An entry after the pages sequence 1 uses names a page outside the pool: never needed, so the trusting kernel
  // (otherwise the correct one) returns the well-formed result, and the checking kernel may refuse or answer.
  PreparedCase pc(paged_case({Malformation::kPageUnusedOutOfPool, 1}));
  for (const char* name : {"planted-varlen-trusts-metadata", "varlen-bm16-bn16", "paged-decode"}) {
    const Judged j = check_case(device(), kernel(name), pc, RunOptions{});
    EXPECT_EQ(j.result.verdict, Verdict::kPass) << name << ": " << j.result.reason << "\n" << evidence(j.result);
  }
  const Judged j = check_case(device(), kernel("planted-varlen-trusts-metadata"), pc, RunOptions{});
  EXPECT_GT(j.result.compared, 0) << "the right answer was compared";
}

TEST(MalformedMetadata, WellFormedCasesAreUnchangedForBothKernels) {
  Case c = varlen_case({});
  PreparedCase pc(c);
  for (const char* name : {"planted-varlen-trusts-metadata", "varlen-bm16-bn16"}) {
    const Judged j = check_case(device(), kernel(name), pc, RunOptions{});
    EXPECT_EQ(j.result.verdict, Verdict::kPass) << name << ": " << j.result.reason;
    EXPECT_EQ(evidence(j.result).find("malformed"), std::string::npos) << evidence(j.result);
  }
}

}  // namespace
}  // namespace attnfuzz
