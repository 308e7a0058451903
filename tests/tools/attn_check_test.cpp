// attn_check_test.cpp - attn-check end to end: verdicts, exit codes, replay, bad input, report files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

struct Result {
  int code;
  std::string out;  // stdout and stderr
};

// Runs attn-check with args (a shell fragment) and the wrong-kernels plug-in; reports into `out`.
Result run(const std::string& args, const std::string& out = "") {
  static int n = 0;
  const fs::path dir = fs::path(TEST_TMP);
  fs::create_directories(dir);
  const fs::path log = dir / ("log-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".txt");
  const std::string o = out.empty() ? (dir / "reports").string() : out;
  const std::string cmd = std::string(ATTN_CHECK) + " --plugin " + WRONG_PLUGIN + " --out " + o + " " + args + " > " +
                          log.string() + " 2>&1";
  const int st = std::system(cmd.c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, ss.str()};
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

std::string fresh(const std::string& name) {
  const fs::path d = fs::path(TEST_TMP) / name;
  fs::remove_all(d);
  return d.string();
}

TEST(AttnCheck, CorrectKernelsPassWithExitZero) {
  Result r = run("--sq 7 --sk 13 --d 59 --mask causal-br --kernel 'flash-*,online-row,test-right'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "all passed")) << r.out;
  EXPECT_TRUE(has(r.out, "flash-bm16-bn32")) << r.out;
}

TEST(AttnCheck, EachWrongKernelFailsWithItsClassAndExitOne) {
  const std::pair<const char*, const char*> cases[] = {
      {"test-scaled", "precision"},   {"test-nan-row", "non-finite"}, {"test-oob-write", "oob-write"},
      {"test-crash", "crash"},        {"test-hang", "hang"},
  };
  for (auto [kernel, cls] : cases) {
    Result r = run(std::string("--sq 33 --sk 20 --d 16 --timeout 2 --kernel ") + kernel);
    EXPECT_EQ(r.code, 1) << kernel << "\n" << r.out;
    EXPECT_TRUE(has(r.out, cls)) << kernel << " should be classified " << cls << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "replay: attn-check --replay ")) << r.out;
  }
}

// Issue 30 item 6b, strides: --repeat-calls launches a sibling with q, k, v head-major before the case; a plan cache
// keyed without the strides (test-stale-strides, launches in one process: --no-isolate) then reads the case's buffers
// with the sibling's strides, and the output is named a stale cache. Quiet without --repeat-calls and where each
// launch is a fresh child (isolated); a correct kernel passes with it (no false positive).
TEST(AttnCheck, RepeatCallsNameAPlanCacheKeyedWithoutTheStrides) {
  const std::string c = " --sq 9 --sk 9 --heads 2 --d 8 --mask causal-br --no-reports --kernel ";
  Result r = run("--repeat-calls --no-isolate" + c + "test-stale-strides");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "ignored-parameter")) << r.out;
  EXPECT_TRUE(has(r.out, "read with those strides") && has(r.out, "keyed without the strides (stale cache)")) << r.out;
  EXPECT_TRUE(has(r.out, "--repeat-calls --no-isolate")) << r.out;  // the replay line keeps the one process
  EXPECT_EQ(run("--no-isolate" + c + "test-stale-strides").code, 0);
  EXPECT_EQ(run("--repeat-calls" + c + "test-stale-strides").code, 0);
  r = run("--repeat-calls --no-isolate" + c + "'test-right,flash-bm16-bn32'");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(AttnCheck, ReplayReproducesTheVerdictBitExactly) {
  const std::string out = fresh("replay");
  Result r = run("--sq 19 --sk 45 --d 13 --mask causal-tl --dist extreme:50 --seed 9 --kernel test-scaled", out);
  ASSERT_EQ(r.code, 1) << r.out;
  const auto pos = r.out.find("replay: attn-check --replay ");
  ASSERT_NE(pos, std::string::npos);
  const std::string file = r.out.substr(pos + 28, r.out.find('\n', pos) - pos - 28);
  const std::string cmd_tail = file.substr(0, file.find(' '));
  ASSERT_TRUE(fs::exists(cmd_tail)) << cmd_tail;
  Result again = run("--replay " + cmd_tail, fresh("replay2"));
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_TRUE(has(again.out, "reproduced")) << again.out;
  // The same failure, the same worst element, to the last bit.
  auto worst = [](const std::string& s) { return s.substr(s.find("worst "), s.find('\n', s.find("worst ")) - s.find("worst ")); };
  EXPECT_EQ(worst(r.out), worst(again.out));
}

// Issue 30: --replay FILE --minimize shrinks the recorded failure with the campaign's minimizer, keeps its class and
// kind of evidence, writes the minimal case beside the file (or under --out) and prints both cases.
TEST(AttnCheck, ReplayMinimizeKeepsClassAndEvidence) {
  const std::string out = fresh("minimize");
  Result r = run("--sq 19 --sk 45 --d 13 --heads 2 --mask causal-tl --seed 9 --kernel test-scaled", out);
  ASSERT_EQ(r.code, 1) << r.out;
  fs::path file;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "corpus")) file = e.path();
  ASSERT_FALSE(file.empty());
  // Without --out (run() always passes one, so this call is direct): beside the original.
  const std::string cmd = std::string(ATTN_CHECK) + " --plugin " + WRONG_PLUGIN + " --no-reports --replay " +
                          file.string() + " --minimize --minimize-time 20 > " + out + "/min.txt 2>&1";
  ASSERT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 0);
  std::ifstream f(out + "/min.txt");
  const std::string mo((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(has(mo, "original: B=1 Hq=2")) << mo;
  EXPECT_TRUE(has(mo, "minimal:  B=1 Hq=1")) << mo;
  EXPECT_TRUE(has(mo, "class:    precision (kept), evidence")) << mo;
  int cases = 0;
  for (const auto& e : fs::directory_iterator(file.parent_path())) cases += e.path().extension() == ".case";
  EXPECT_EQ(cases, 2) << "the minimal case is written beside the original";
  const auto at = mo.find("replay: attn-check --replay ") + 28;
  const std::string minimal = mo.substr(at, mo.find(' ', at) - at);
  Result again = run("--replay " + minimal, fresh("minimize2"));
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_TRUE(has(again.out, "recorded fail/precision, now fail/precision -> reproduced")) << again.out;
  // --out DIR puts it there; --minimize without --replay is exit 2.
  const std::string there = fresh("minimize3");
  EXPECT_EQ(run("--replay " + file.string() + " --minimize", there).code, 0);
  EXPECT_TRUE(fs::exists(fs::path(there) / fs::path(minimal).filename()));
  EXPECT_EQ(run("--minimize --sq 3").code, 2);
}

// Issue 30 item 4: --bug-report DIR for a plug-in kernel: README.md with the class, evidence and a replay
// command that reproduces the failure from the bundle's case file (here the minimal one: --minimize), and the
// heatmap.
TEST(AttnCheck, BugReportBundlesAPluginFailure) {
  const std::string out = fresh("bug-report");
  Result r = run("--sq 19 --sk 45 --d 13 --heads 2 --mask causal-tl --seed 9 --kernel test-scaled", out);
  ASSERT_EQ(r.code, 1) << r.out;
  fs::path file;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "corpus")) file = e.path();
  const std::string dir = fresh("bug-report-bundle");
  r = run("--replay " + file.string() + " --bug-report " + dir + " --minimize --minimize-time 10",
          fresh("bug-report2"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(fs::path(dir) / "README.md");
  const std::string readme((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(has(readme, "# test-scaled: precision on ordinary inputs")) << readme;
  EXPECT_TRUE(has(readme, "(minimized from `B=1 Hq=2")) << readme;
  EXPECT_TRUE(has(readme, "## Evidence")) << readme;
  EXPECT_FALSE(has(readme, "repro.py")) << readme;  // a plug-in kernel: the replay command is the reproducer
  EXPECT_FALSE(fs::exists(fs::path(dir) / "repro.py"));
  const auto at = readme.find("    attn-check --replay ") + 4;
  const std::string replay = readme.substr(at, readme.find("    #", at) - at);
  ASSERT_TRUE(has(replay, dir + "/corpus/precision-")) << replay;
  int svg = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) svg += e.path().extension() == ".svg";
  EXPECT_EQ(svg, 1) << "the heatmap";
  const std::string args = replay.substr(replay.find("--replay ") + 9);
  Result again = run("--replay " + args.substr(0, args.find(' ')), fresh("bug-report3"));
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_TRUE(has(again.out, "-> reproduced")) << again.out;
  // Two files, or none with a failure: exit 2 with one line.
  EXPECT_EQ(run("--replay " + file.string() + " " + file.string() + " --bug-report " + dir).code, 2);
}

// Issue 30: failures are counted by input tier, ordinary first; --fail-tiers chooses the tiers that make exit 1.
TEST(AttnCheck, FailTiersChooseWhatCountsForTheExitStatus) {
  const std::string c = "--no-reports --sq 9 --d 8 --kernel test-scaled";  // an ordinary-tier failure
  Result all = run(c);
  EXPECT_EQ(all.code, 1) << all.out;
  EXPECT_TRUE(has(all.out, "failures by input tier: ordinary 1, extreme 0,")) << all.out;
  EXPECT_EQ(run(c + " --fail-tiers ordinary").code, 1);
  Result other = run(c + " --fail-tiers extreme,non-finite-masked");
  EXPECT_EQ(other.code, 0) << other.out;
  EXPECT_TRUE(has(other.out, "exit 0: every failure is in a tier --fail-tiers extreme,non-finite-masked does not"))
      << other.out;
  Result bad = run(c + " --fail-tiers bogus");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.out, "'bogus' is not a tier")) << bad.out;
}

// Issue 30: --values activations: LLM-like inputs, ordinary tier; a case flag outside the domain is one line,
// exit 2.
TEST(AttnCheck, ActivationsDomainCasesAreOrdinaryAndOutsideIsExit2) {
  Result ok = run("--no-reports --sq 9 --d 8 --kernel test-scaled --values activations");
  EXPECT_EQ(ok.code, 1) << ok.out;
  EXPECT_TRUE(has(ok.out, "failures by input tier: ordinary 1, extreme 0,")) << ok.out;
  EXPECT_EQ(run("--no-reports --sq 9 --d 8 --kernel test-right --values activations").code, 0);
  for (const char* bad : {"--special nan@k:masked", "--dist extreme:30", "--scale 0", "--special huge@v"}) {
    Result r = run(std::string("--no-reports --sq 9 --d 8 --kernel test-right --values activations ") + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "activations value domain")) << bad << "\n" << r.out;
  }
}

TEST(AttnCheck, SweepRunsEveryKernelOnTheEdgeGridWithProgress) {
  Result r = run("--sweep --kernel test-right,online-row", fresh("sweep"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "100%]")) << "progress line missing\n" << r.out;
  EXPECT_TRUE(has(r.out, "online-row")) << r.out;
}

// Issue 28: `--sweep --variant all` puts every variant in one case; a kernel declaring some of them gets each case
// with those only (label "-fit-<variants>"), so a planted sink bug is found there and nothing is unsupported.
TEST(AttnCheck, AVariantSweepChecksEachKernelUnderTheVariantsItDeclares) {
  const std::string out = fresh("variant-fit");
  Result r = run(std::string("--plugin ") + PLANTED_PLUGIN +
                     " --sweep --variant all --no-isolate --workers 1 --kernel planted-sink-ignored-prefill",
                 out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "ignored-parameter")) << r.out;
  EXPECT_FALSE(has(r.out, "NOTHING CHECKED")) << r.out;
  std::ifstream jf(fs::path(out) / "report.json");
  const auto j = nlohmann::json::parse(jf);
  size_t checked = 0;
  for (const auto& e : j.at("results")) {
    EXPECT_NE(e.at("verdict"), "unsupported") << e.dump();
    const std::string label = j.at("cases").at(e.at("case").get<size_t>()).at("label");
    EXPECT_TRUE(label.ends_with("-fit-sink+softcap+alibi+bias")) << label;  // what it declares, no mask
    ++checked;
  }
  EXPECT_GT(checked, 100u);
}

TEST(AttnCheck, ReportsAreWrittenAndWellFormed) {
  const std::string out = fresh("reports");
  Result r = run("--sq 40 --sk 40 --d 8 --mask causal-br --kernel test-nan-row,test-right", out);
  ASSERT_EQ(r.code, 1) << r.out;
  for (const char* f : {"report.json", "summary.md", "junit.xml"}) EXPECT_TRUE(fs::exists(fs::path(out) / f)) << f;
  std::ifstream jf(fs::path(out) / "report.json");
  const auto j = nlohmann::json::parse(jf);
  EXPECT_EQ(j.at("schema"), "attnfuzz-report");
  ASSERT_EQ(j.at("results").size(), 2u);
  bool saw_fail = false;
  for (const auto& e : j.at("results")) {
    for (const char* k : {"kernel", "case", "verdict", "worst"}) EXPECT_TRUE(e.contains(k)) << k;
    EXPECT_LT(e.at("case").get<size_t>(), j.at("cases").size());  // schema 2: each case once, by index
    if (e.at("verdict") == "fail") {
      saw_fail = true;
      EXPECT_EQ(e.at("class"), "non-finite");
      EXPECT_FALSE(e.at("worst").empty());
    }
  }
  EXPECT_TRUE(saw_fail);
  int svgs = 0;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().extension() == ".svg") {
      ++svgs;
      const std::string cmd = "xmllint --noout " + e.path().string() + " > /dev/null 2>&1";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << "SVG is not well-formed XML: " << e.path();
    }
  EXPECT_EQ(svgs, 1);
  EXPECT_EQ(std::system(("xmllint --noout " + out + "/junit.xml").c_str()), 0);
}

TEST(AttnCheck, BadInputIsExitTwoWithAMessage) {
  const std::pair<std::string, std::string> cases[] = {
      {"--sq 0", "sq"},
      {"--heads 3 --kv-heads 2", "multiple"},
      {"--mask diagonal", "mask"},
      {"--kernel no-such-kernel", "no kernel matches"},
      {"--kernel test-nomask-only --mask causal", "does not support"},
      {"--backend tpu", "--backend: tpu not in {cpu,nvidia,amd,auto}"},
      {"--dist weird", "dist"},
      {"--special nan@x", "special"},
      {"--no-such-flag", "no-such-flag"},
      {"--scale abc", "scale"},
      {"--replay /nonexistent/file.case", "nonexistent"},
  };
  for (const auto& [args, msg] : cases) {
    Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_TRUE(has(r.out, msg)) << args << ": message should mention '" << msg << "'\n" << r.out;
  }
}

TEST(AttnCheck, CorruptForeignTruncatedAndFutureCorpusFilesAreExitTwo) {
  const fs::path dir = fs::path(TEST_TMP) / "bad-corpus";
  fs::create_directories(dir);
  const std::pair<const char*, const char*> files[] = {
      {"foreign.case", "hello world\n"},
      {"truncated.case", "ATTNFUZZ-CASE 1\n{\"format\": 1, \"tool\": {"},
      {"future.case", "ATTNFUZZ-CASE 99\n{}\n"},
      {"corrupt.case", "ATTNFUZZ-CASE 1\n{\"format\": 1, \"tool\": {\"name\": \"x\", \"version\": \"1\"}, \"case\": 7}\n"},
  };
  for (auto [name, text] : files) {
    std::ofstream(dir / name) << text;
    Result r = run("--replay " + (dir / name).string());
    EXPECT_EQ(r.code, 2) << name << "\n" << r.out;
    EXPECT_TRUE(has(r.out, name)) << "the message should name the file\n" << r.out;
  }
}

TEST(AttnCheck, UnwritableOutIsExitTwo) {
  Result r = run("--sq 4", "/proc/attn-fuzz-cannot-write-here");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "cannot write")) << r.out;
}

TEST(AttnCheck, ListAndHelp) {
  Result r = run("--list");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "test-scaled")) << r.out;
  EXPECT_TRUE(has(r.out, "materialized")) << r.out;
  r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "Examples:")) << r.out;
}

}  // namespace
