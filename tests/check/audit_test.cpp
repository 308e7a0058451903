// audit_test.cpp - the audit of passing cases (issue 11 item 7): canned compute-sanitizer reports become
// barrier-race / oob-* failures with the sanitizer's lines as evidence; cpu thread-order audit; no false
// alarm.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include "attnfuzz/case.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "check/classify.h"
#include "check/detectors/detectors.h"
#include "check/runner.h"

namespace fs = std::filesystem;

namespace attnfuzz {
namespace {

void load() {
  static std::once_flag once;
  std::call_once(once, [] { Registry::global().load_plugin(PLANTED_PLUGIN); });
}

const KernelEntry& kernel(const std::string& name) {
  load();
  const KernelEntry* e = Registry::global().find(Backend::kCpu, name);
  if (!e) throw std::runtime_error(name + " is not registered");
  return *e;
}

std::unique_ptr<Device> cpu(ThreadOrder order) {
  DeviceOptions o;
  o.order = order;
  return open_device("cpu", o);
}

Case make(int64_t sq, int64_t sk, int64_t d, const std::string& mask) {
  Problem p = make_problem(1, 1, 1, sq, sk, d, d);
  EXPECT_EQ(parse_mask(mask, p), "");
  return make_case(p, 5);
}

std::string evidence(const CheckResult& r) {
  std::string s;
  for (const Evidence& e : r.evidence) s += e.detector + ": " + e.detail + "\n";
  return s;
}

// ---- canned compute-sanitizer reports (the formats CUDA 12 / 13 print)
// ---------------------------------------

const char* const kRacecheckHazard =
    "========= COMPUTE-SANITIZER\n"
    "========= Warning: Race reported between Write access at online_row_kernel(af_problem, float const *, "
    "float const *, float const *, float *, float *)+0x5d0 in online_row_bugs.hip:52\n"
    "=========     and Read access at online_row_kernel(...)+0x6a0 in online_row_bugs.hip:61 [62 hazards]\n"
    "=========\n"
    "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)\n";
const char* const kRacecheckClean =
    "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n";
const char* const kSynccheckBarrier =
    "========= COMPUTE-SANITIZER\n"
    "========= Barrier error detected. Divergent thread(s) in warp\n"
    "=========     at flash_kernel+0x1c0 in flash_bugs.hip:120\n"
    "========= ERROR SUMMARY: 1 error\n";
const char* const kClean = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n";
const char* const kMemcheckRead =
    "========= COMPUTE-SANITIZER\n"
    "========= Invalid __global__ read of size 4 bytes\n"
    "=========     at planted_flash_kernel+0x3b0 in flash_bugs.hip:96\n"
    "=========     by thread (3,0,0) in block (0,0,0)\n"
    "=========     Address 0x7f3a00010040 is out of bounds\n"
    "========= ERROR SUMMARY: 15 errors\n";
const char* const kMemcheckWrite =
    "========= Invalid __global__ write of size 4 bytes\n"
    "=========     at planted_flash_kernel+0x900 in flash_bugs.hip:180\n"
    "========= Invalid __global__ read of size 4 bytes\n"
    "=========     at planted_flash_kernel+0x3b0 in flash_bugs.hip:96\n"
    "========= ERROR SUMMARY: 2 errors\n";

TEST(SanitizerClass, HazardsNameTheirClass) {
  auto cls = [](std::initializer_list<std::pair<const char*, const char*>> reports) {
    std::vector<SanitizerReport> v;
    for (auto [tool, text] : reports) v.push_back(parse_compute_sanitizer(tool, text));
    return std::string(failure_class_name(sanitizer_class(v)));
  };
  EXPECT_EQ(cls({{"racecheck", kRacecheckHazard}, {"synccheck", kClean}, {"memcheck", kClean}}),
            "barrier-race");
  EXPECT_EQ(cls({{"racecheck", kRacecheckClean}, {"synccheck", kSynccheckBarrier}, {"memcheck", kClean}}),
            "barrier-race");
  EXPECT_EQ(cls({{"racecheck", kRacecheckClean}, {"synccheck", kClean}, {"memcheck", kMemcheckRead}}),
            "oob-read");
  // A write outranks a read and a race (check/README.md precedence).
  EXPECT_EQ(cls({{"racecheck", kRacecheckHazard}, {"synccheck", kClean}, {"memcheck", kMemcheckWrite}}),
            "oob-write");
  EXPECT_EQ(cls({{"racecheck", kRacecheckClean}, {"synccheck", kClean}, {"memcheck", kClean}}), "none");
  // A tool that could not say (no summary at all, e.g. it crashed) is not a hazard.
  EXPECT_EQ(cls({{"racecheck", "compute-sanitizer: command not found\n"}}), "none");
}

// A stand-in compute-sanitizer that prints canned reports per --tool and records its command lines.
class FakeSanitizer {
 public:
  FakeSanitizer(const std::string& race, const std::string& sync, const std::string& mem) {
    char tmpl[] = "/tmp/attnfuzz-audit-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    write("racecheck.txt", race);
    write("synccheck.txt", sync);
    write("memcheck.txt", mem);
    write("compute-sanitizer",
          "#!/bin/sh\n"
          "echo \"$@\" >> '" +
              dir_ +
              "/args.txt'\n"
              "cat '" +
              dir_ + "/'\"$2\".txt\n");
    fs::permissions(dir_ + "/compute-sanitizer", fs::perms::owner_all);
  }
  ~FakeSanitizer() { fs::remove_all(dir_); }
  std::string binary() const { return dir_ + "/compute-sanitizer"; }
  std::string dir() const { return dir_; }
  std::string args() const {
    std::ifstream in(dir_ + "/args.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ + "/" + name) << text; }
  std::string dir_;
};

// The compute-sanitizer experiment on a case that passed: the stand-in's racecheck hazard becomes a
// barrier-race with the sanitizer's lines as evidence, and each tool ran on the case file with the kernel.
TEST(ComputeSanitizerTools, CannedHazardsBecomeTheClassWithTheirLines) {
  auto dev = cpu(ThreadOrder::kForward);
  const KernelEntry& k = kernel("flash-bm16-bn16");
  PreparedCase pc(make(7, 13, 16, "causal-br"));
  RunOptions ro;
  Judged j = check_case(*dev, k, pc, ro);
  ASSERT_EQ(j.result.verdict, Verdict::kPass);
  FakeSanitizer fake(kRacecheckHazard, kClean, kClean);
  ClassifyOptions co;
  co.compute_sanitizer_binary = fake.binary();
  co.self_binary = "/bin/true";
  co.work_dir = fake.dir() + "/work";
  ClassifyStats stats;
  detect::Context c{*dev, k, pc, ro, j, co, stats, {}};
  const detect::Finding f = detect::compute_sanitizer_tools(c);
  EXPECT_TRUE(f.fired);
  EXPECT_EQ(f.cls, FailureClass::kBarrierRace);
  std::string ev;
  for (const Evidence& e : f.evidence) ev += e.detector + ": " + e.detail + "\n";
  EXPECT_NE(ev.find("racecheck: 1 error(s)"), std::string::npos) << ev;
  EXPECT_NE(ev.find("Race reported between Write access"), std::string::npos) << ev;
  EXPECT_NE(ev.find("memcheck: 0 error(s)"), std::string::npos) << ev;
  const std::string args = fake.args();
  for (const char* tool : {"--tool racecheck", "--tool synccheck", "--tool memcheck"})
    EXPECT_NE(args.find(tool), std::string::npos) << args;
  EXPECT_NE(args.find("--kernel flash-bm16-bn16 --backend cpu"), std::string::npos) << args;
  EXPECT_NE(args.find("--no-classify"), std::string::npos) << args;
}

TEST(ComputeSanitizerTools, MissingBinaryIsEvidenceNotAnError) {
  auto dev = cpu(ThreadOrder::kForward);
  const KernelEntry& k = kernel("flash-bm16-bn16");
  PreparedCase pc(make(7, 13, 16, "none"));
  RunOptions ro;
  Judged j = check_case(*dev, k, pc, ro);
  ClassifyOptions co;
  co.compute_sanitizer_binary = "/nonexistent/compute-sanitizer";
  ClassifyStats stats;
  detect::Context c{*dev, k, pc, ro, j, co, stats, {}};
  const detect::Finding f = detect::compute_sanitizer_tools(c);
  EXPECT_FALSE(f.fired);
  ASSERT_FALSE(f.evidence.empty());
  EXPECT_NE(f.evidence[0].detail.find("not on PATH"), std::string::npos);
}

// cpu audit: planted-no-score-barrier passes in forward order (thread 0 runs first); the audit's other thread
// orders show the race, and the pass becomes a barrier-race failure whose evidence says the output passed.
TEST(AuditPassingCase, CpuThreadOrdersExposeALatentRace) {
  auto dev = cpu(ThreadOrder::kForward);
  const KernelEntry& k = kernel("planted-no-score-barrier");
  PreparedCase pc(make(4, 20, 64, "none"));
  RunOptions ro;
  Judged j = check_case(*dev, k, pc, ro);
  ASSERT_EQ(j.result.verdict, Verdict::kPass) << j.result.reason;
  const AuditStats a = audit_passing_case(*dev, k, pc, ro, j, ClassifyOptions{});
  const std::string ev = evidence(j.result);
  EXPECT_TRUE(a.ran);
  EXPECT_TRUE(a.found) << ev;
  EXPECT_EQ(j.result.verdict, Verdict::kFail);
  EXPECT_EQ(j.result.failure, FailureClass::kBarrierRace) << ev;
  EXPECT_NE(ev.find("audit: the output passed"), std::string::npos) << ev;
  EXPECT_NE(ev.find("forward (checked) pass"), std::string::npos) << ev;
  EXPECT_NE(j.result.reason.find("audit of a passing case"), std::string::npos);
}

// Zero false positives: correct kernels stay passing under the audit, on shapes with several tiles / splits.
TEST(AuditPassingCase, CorrectKernelsStayPassing) {
  auto dev = cpu(ThreadOrder::kShuffle);
  for (const char* name : {"flash-bm16-bn16", "flash-bm32-bn32", "online-row", "materialized", "split-kv"})
    for (const char* mask : {"none", "causal-br", "window:5,3-tl"}) {
      const KernelEntry& k = kernel(name);
      PreparedCase pc(make(33, 40, 17, mask));
      RunOptions ro;
      Judged j = check_case(*dev, k, pc, ro);
      ASSERT_EQ(j.result.verdict, Verdict::kPass) << name << " " << mask;
      const AuditStats a = audit_passing_case(*dev, k, pc, ro, j, ClassifyOptions{});
      EXPECT_TRUE(a.ran);
      EXPECT_FALSE(a.found) << name << " " << mask << "\n" << evidence(j.result);
      EXPECT_EQ(j.result.verdict, Verdict::kPass) << name << " " << mask;
    }
}

TEST(AuditPassingCase, LeavesFailuresAlone) {
  auto dev = cpu(ThreadOrder::kForward);
  const KernelEntry& k = kernel("planted-headdim-unroll4");
  PreparedCase pc(make(4, 40, 59, "none"));
  RunOptions ro;
  Judged j = check_case(*dev, k, pc, ro);
  ASSERT_EQ(j.result.verdict, Verdict::kFail);
  const size_t before = j.result.evidence.size();
  EXPECT_FALSE(audit_passing_case(*dev, k, pc, ro, j, ClassifyOptions{}).ran);
  EXPECT_EQ(j.result.evidence.size(), before);
}

}  // namespace
}  // namespace attnfuzz
