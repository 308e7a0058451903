// cli_test.cpp - what every tool's command line shows (tools/cli_common.cpp, tools/kernel_list.cpp): --version on
// every binary in build/bin, --list aligned and --list --json with the same facts, --help grouped with one
// rendering, counts and seconds in words, the worst element printed once, help examples that name real kernels.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Result {
  int code;
  std::string out;  // stdout (and stderr when merged)
};

Result run(const std::string& cmd, bool merge_stderr = true) {
  static int n = 0;
  const fs::path dir = fs::path(TEST_TMP) / "cli";
  fs::create_directories(dir);
  const fs::path log = dir / ("log-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".txt");
  const int st = std::system((cmd + " > " + log.string() + (merge_stderr ? " 2>&1" : " 2>/dev/null")).c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, ss.str()};
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

const std::string kCheck = ATTN_CHECK, kFuzz = ATTN_FUZZ, kProps = ATTN_PROPS;
const std::string kOut = " --out " + (fs::path(TEST_TMP) / "cli" / "reports").string();

// Every executable next to attn-check answers --version with "<name> <version>" on stdout and exit 0: a new
// tool without --version fails here.
TEST(Cli, VersionOnEveryToolInBin) {
  int tools = 0;
  for (const auto& e : fs::directory_iterator(fs::path(kCheck).parent_path())) {
    if (!e.is_regular_file() || ::access(e.path().c_str(), X_OK) != 0) continue;
    ++tools;
    const Result r = run(e.path().string() + " --version", false);
    EXPECT_EQ(r.code, 0) << e.path();
    EXPECT_EQ(r.out, e.path().filename().string() + " " ATTNFUZZ_VERSION "\n") << e.path();
  }
  EXPECT_GE(tools, 3);
}

// --list --json: one document, a kernel per registered kernel with every fact the table shows.
TEST(Cli, ListJsonHasEveryKernelWithItsCapabilities) {
  const Result r = run(kCheck + " --plugin " PLANTED_PLUGIN " --backend cpu --list --json" + kOut, false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("tool").at("name"), "attn-check");
  EXPECT_EQ(j.at("tool").at("version"), ATTNFUZZ_VERSION);
  const auto& ks = j.at("kernels");
  ASSERT_GT(ks.size(), 40u);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& k : ks) {
    for (const char* key : {"name", "family", "description", "kind", "backend", "origin", "passes", "dtypes",
                            "bwd_dtypes", "masks", "layouts", "page_sizes", "max_head_dim", "max_head_dim_v",
                            "needs_dv_eq_d", "lse", "compute_model", "tunables", "variants", "dropout_rngs"})
      EXPECT_TRUE(k.contains(key)) << key << " in " << k.dump();
    by_name[k.at("name")] = k;
  }
  const auto& pd = by_name.at("paged-decode");
  EXPECT_EQ(pd.at("tunables").at(0).at("name"), "num_splits");
  EXPECT_EQ(pd.at("tunables").at(0).at("default"), 8);
  EXPECT_EQ(pd.at("page_sizes").at("min"), 16);
  EXPECT_NE(std::find(pd.at("layouts").begin(), pd.at("layouts").end(), "decode"), pd.at("layouts").end());
  const auto& fl = by_name.at("flash-bm16-bn32");
  EXPECT_EQ(fl.at("passes"), nlohmann::json({"fwd", "bwd", "fwdbwd"}));
  EXPECT_EQ(fl.at("bwd_dtypes"), nlohmann::json({"f32", "f16", "bf16"}));
  EXPECT_EQ(fl.at("masks").size(), 5u);
  EXPECT_EQ(by_name.at("online-row").at("max_head_dim"), nullptr);  // no limit
  EXPECT_EQ(by_name.at("online-row").at("max_head_dim_v"), 256);
  EXPECT_EQ(by_name.at("online-row").at("passes"), nlohmann::json({"fwd"}));
  EXPECT_EQ(by_name.at("online-row").at("bwd_dtypes"), nlohmann::json::array());
  EXPECT_EQ(by_name.at("planted-no-max-sub").at("origin"), PLANTED_PLUGIN);
  // The table lists the same kernels, one row each.
  const Result t = run(kCheck + " --plugin " PLANTED_PLUGIN " --backend cpu --list" + kOut, false);
  ASSERT_EQ(t.code, 0) << t.out;
  size_t rows = 0;
  for (const auto& l : lines(t.out)) rows += by_name.count(l.substr(0, l.find(' '))) > 0;
  EXPECT_EQ(rows, ks.size()) << t.out;
}

// The table's columns start where the header's do, on every row, whatever the kernel names' lengths.
TEST(Cli, ListColumnsDoNotDrift) {
  const Result r = run(kCheck + " --plugin " PLANTED_PLUGIN " --backend cpu --list" + kOut, false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ls = lines(r.out);
  ASSERT_GT(ls.size(), 3u);
  const std::string& head = ls[0];
  for (const char* col : {"kernel", "kind", "family", "backend", "passes", "dtypes", "bwd-dtypes", "masks", "layouts",
                          "max-D/Dv", "lse", "compute", "tunables", "variants", "origin"})
    EXPECT_TRUE(has(head, col)) << col << " missing in " << head;
  std::vector<size_t> starts;
  for (size_t i = 0; i < head.size(); ++i)
    if (head[i] != ' ' && (i == 0 || head[i - 1] == ' ')) starts.push_back(i);
  for (size_t n = 1; n < ls.size(); ++n) {
    const std::string& l = ls[n];
    if (l.rfind("device:", 0) == 0) break;
    for (size_t s : starts) {
      ASSERT_LT(s, l.size()) << l;
      EXPECT_TRUE(l[s] != ' ' && (s == 0 || l[s - 1] == ' ')) << "column at " << s << " drifts in\n" << l;
    }
  }
  EXPECT_TRUE(has(r.out, "\nonline-row ")) << r.out;
}

// --help-all: every option in topic groups, each type in one rendering (no CLI11 "TYPE:VALIDATOR" joins, no
// Excludes: lists), lines wrapped.
TEST(Cli, HelpIsGroupedWithOneRendering) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> tools = {
      {kCheck, {"Kernels and device:", "Oracle and reports:", "Classification", "Case (", "Sequences", "Mode (",
                "External outputs"}},
      {kFuzz, {"Kernels and device:", "Campaign (", "Campaigns beyond one machine", "Mode ("}},
      {kProps, {"Properties:", "Kernels:", "Cases:", "Output:"}}};
  for (const auto& [tool, groups] : tools) {
    if (tool.empty()) continue;  // attn-props not built
    const Result r = run(tool + (tool == kProps ? " --help" : " --help-all"), false);
    ASSERT_EQ(r.code, 0) << tool;
    for (const auto& g : groups) EXPECT_TRUE(has(r.out, "\n" + g)) << tool << ": no group " << g << "\n" << r.out;
    const std::string options = r.out.substr(0, r.out.find("\nExamples:"));
    for (const char* bad : {"Excludes:", "Needs:", "TEXT:", "UINT:", "INT:", "FLOAT:", " - "})
      EXPECT_FALSE(has(options, bad)) << tool << ": '" << bad << "' in\n" << options;
    for (const auto& l : lines(options)) EXPECT_LE(l.size(), 110u) << tool << ": " << l;
    EXPECT_TRUE(has(options, "INT in [")) << options;
  }
}

// --help fits a screen or two: the groups a first run needs, the others named in one line that points to
// --help-all, the examples; every option --help shows, --help-all shows too.
TEST(Cli, HelpIsShortAndHelpAllHasEveryOption) {
  for (const std::string& tool : {kCheck, kFuzz}) {
    const Result brief = run(tool + " --help", false), all = run(tool + " --help-all", false);
    ASSERT_EQ(brief.code, 0) << tool;
    ASSERT_EQ(all.code, 0) << tool;
    EXPECT_LE(lines(brief.out).size(), 90u) << brief.out;
    EXPECT_GE(lines(all.out).size(), lines(brief.out).size() + 50) << all.out;
    for (const char* must : {"\n  --kernel", "--backend", "\nMore options (--help-all): ", "\nExamples:"})
      EXPECT_TRUE(has(brief.out, must)) << tool << ": no '" << must << "' in\n" << brief.out;
    for (const auto& l : lines(brief.out.substr(0, brief.out.find("\nMore options"))))
      if (l.rfind("  --", 0) == 0) EXPECT_TRUE(has(all.out, "\n" + l)) << tool << ": " << l;
  }
}

// Counts in words ("1 check", "1 worker"), the worst element once.
TEST(Cli, NumberFormats) {
  const fs::path out = fs::path(TEST_TMP) / "cli" / "formats";
  fs::remove_all(out);
  const Result r = run(kCheck + " --plugin " PLANTED_PLUGIN " --backend cpu --workers 1 --kernel planted-causal-off-by-one "
                       "--sq 16 --sk 16 --d 8 --mask causal-br --out " + out.string());
  ASSERT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "(1 worker, warp 32")) << r.out;
  EXPECT_TRUE(has(r.out, ": 1 check\n")) << r.out;
  EXPECT_TRUE(has(r.out, "\n1 check in ")) << r.out;
  EXPECT_FALSE(has(r.out, "check(s)")) << r.out;
  size_t worst = 0;
  for (size_t at = r.out.find("worst O["); at != std::string::npos; at = r.out.find("worst O[", at + 1)) ++worst;
  EXPECT_EQ(worst, 1u) << r.out;
  std::ifstream md(out / "summary.md");
  std::string first;
  std::getline(md, first);
  EXPECT_TRUE(has(first, " run: 1 check, 1 failure")) << first;
}

// Every --kernel NAME in a help's examples is a kernel that exists (built in, planted, or the plug-in example).
TEST(Cli, HelpExamplesNameRealKernels) {
  const Result list = run(kCheck + " --plugin " PLANTED_PLUGIN " --backend cpu --list --json" + kOut, false);
  ASSERT_EQ(list.code, 0) << list.out;
  std::set<std::string> known;
  const nlohmann::json listed = nlohmann::json::parse(list.out);
  for (const auto& k : listed.at("kernels")) known.insert(k.at("name").get<std::string>());
  std::ifstream ex(std::string(SOURCE_DIR) + "/examples/plugin/naive_attention.hip");
  const std::string ex_src((std::istreambuf_iterator<char>(ex)), {});
  const std::regex decl(R"re(\.name = "([^"]+)")re");
  for (auto it = std::sregex_iterator(ex_src.begin(), ex_src.end(), decl); it != std::sregex_iterator(); ++it)
    known.insert((*it)[1]);
  ASSERT_TRUE(known.count("example-naive"));
  const std::regex kernel_flag(R"re(--kernel '?([^ ']+)'?)re");
  for (const std::string& tool : {kCheck, kFuzz}) {
    const Result h = run(tool + " --help", false);
    const std::string ex_text = h.out.substr(h.out.find("Examples:"));
    for (auto it = std::sregex_iterator(ex_text.begin(), ex_text.end(), kernel_flag); it != std::sregex_iterator();
         ++it) {
      const std::string name = (*it)[1];
      if (name.find_first_of("*?[,") != std::string::npos) continue;  // a glob
      EXPECT_TRUE(known.count(name)) << tool << " --help names kernel '" << name << "', which does not exist";
    }
  }
}

}  // namespace

// Model presets (issue 28 item 9): --preset list, a bad name is one line and exit 2, a cheap preset sweep passes.
namespace attnfuzz {
TEST(Cli, PresetListBadNameAndSweep) {
  const Result list = run(kCheck + " --preset list");
  EXPECT_EQ(list.code, 0) << list.out;
  EXPECT_TRUE(has(list.out, "deepseek-v3") && has(list.out, "kv-shared (V the first Dv columns of K)"))
      << list.out;
  const Result bad = run(kCheck + " --sweep --preset llama-9");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(lines(bad.out).size(), 1u) << bad.out;
  EXPECT_TRUE(has(bad.out, "is not a preset: one of llama-3.1")) << bad.out;
  EXPECT_EQ(run(kCheck + " --preset gpt-oss").code, 2);  // without --sweep
  const Result oss = run(kCheck + " --sweep --preset gpt-oss --kernel 'flash-*'" + kOut);
  EXPECT_EQ(oss.code, 0) << oss.out;
  EXPECT_TRUE(has(oss.out, "all passed")) << oss.out;
  // attn-fuzz takes the same option (tools/cli_common): list, a bad name and a preset it cannot fuzz yet.
  EXPECT_EQ(run(kFuzz + " --preset list").code, 0);
  const Result fbad = run(kFuzz + " --preset llama-9 --max-time 1" + kOut);
  EXPECT_EQ(fbad.code, 2);
  EXPECT_EQ(lines(fbad.out).size(), 1u) << fbad.out;
  EXPECT_TRUE(has(fbad.out, "is not a preset: one of llama-3.1")) << fbad.out;
  const Result mla = run(kFuzz + " --preset deepseek-v3 --max-time 1" + kOut);
  EXPECT_EQ(mla.code, 2);
  EXPECT_TRUE(has(mla.out, "is MLA (kv-shared)")) << mla.out;
}
}  // namespace attnfuzz
