// report_test.cpp - report writers: JSON schema fields, Markdown content, well-formed SVG and JUnit XML.
#include "attnfuzz/report.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace attnfuzz {
namespace {

namespace fs = std::filesystem;

// A small XML well-formedness check: balanced, properly nested tags, quoted attributes, escaped text.
// Returns an empty string when well formed, else what is wrong.
std::string xml_problem(const std::string& x) {
  std::vector<std::string> stack;
  size_t i = 0;
  int roots = 0;
  auto name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' || c == '.';
  };
  while (i < x.size()) {
    if (x[i] == '&') {
      const size_t semi = x.find(';', i);
      if (semi == std::string::npos || semi - i > 8) return "bare & at " + std::to_string(i);
      const std::string ent = x.substr(i, semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;" && ent != "&apos;" &&
          ent[1] != '#')
        return "unknown entity " + ent;
      i = semi + 1;
      continue;
    }
    if (x[i] == '>') return "bare > in text at " + std::to_string(i);
    if (x[i] != '<') {
      if (stack.empty() && !std::isspace(static_cast<unsigned char>(x[i]))) return "text outside the root";
      ++i;
      continue;
    }
    if (x.compare(i, 5, "<?xml") == 0) {
      if (i != 0) return "xml declaration not at the start";
      i = x.find("?>", i);
      if (i == std::string::npos) return "unterminated declaration";
      i += 2;
      continue;
    }
    if (x.compare(i, 4, "<!--") == 0) {
      i = x.find("-->", i);
      if (i == std::string::npos) return "unterminated comment";
      i += 3;
      continue;
    }
    if (x.compare(i, 2, "</") == 0) {
      size_t j = i + 2;
      while (j < x.size() && name_char(x[j])) ++j;
      const std::string name = x.substr(i + 2, j - i - 2);
      if (j >= x.size() || x[j] != '>') return "bad end tag " + name;
      if (stack.empty() || stack.back() != name)
        return "end tag " + name + " does not match " + (stack.empty() ? "" : stack.back());
      stack.pop_back();
      i = j + 1;
      continue;
    }
    size_t j = i + 1;
    while (j < x.size() && name_char(x[j])) ++j;
    const std::string name = x.substr(i + 1, j - i - 1);
    if (name.empty()) return "empty tag name at " + std::to_string(i);
    for (;;) {
      while (j < x.size() && std::isspace(static_cast<unsigned char>(x[j]))) ++j;
      if (j >= x.size()) return "unterminated tag " + name;
      if (x[j] == '>' || x.compare(j, 2, "/>") == 0) break;
      const size_t a = j;
      while (j < x.size() && name_char(x[j])) ++j;
      if (j == a || j >= x.size() || x[j] != '=') return "bad attribute in " + name;
      ++j;
      if (j >= x.size() || x[j] != '"') return "unquoted attribute in " + name;
      const size_t end = x.find('"', j + 1);
      if (end == std::string::npos) return "unterminated attribute in " + name;
      const std::string value = x.substr(j + 1, end - j - 1);
      if (value.find('<') != std::string::npos) return "< in attribute of " + name;
      for (size_t k = value.find('&'); k != std::string::npos; k = value.find('&', k + 1))
        if (value.find(';', k) == std::string::npos) return "bare & in attribute of " + name;
      j = end + 1;
    }
    if (stack.empty()) {
      if (++roots > 1) return "two root elements";
    }
    if (x[j] == '>') {
      stack.push_back(name);
      i = j + 1;
    } else {
      i = j + 2;
    }
  }
  if (!stack.empty()) return "unclosed " + stack.back();
  if (roots != 1) return "no root element";
  return {};
}

// Runs xmllint on the text when it is installed (the build records its path).
void expect_xmllint_ok(const std::string& text, const std::string& name) {
#ifdef ATTNFUZZ_XMLLINT
  const fs::path p =
      fs::temp_directory_path() / ("attnfuzz-xmllint-" + std::to_string(::getpid()) + "-" + name);
  {
    std::ofstream out(p);
    out << text;
  }
  const std::string cmd = std::string(ATTNFUZZ_XMLLINT) + " --noout '" + p.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << name << " rejected by xmllint";
  fs::remove(p);
#else
  (void)text;
  (void)name;
#endif
}

Case labelled(const std::string& label, const std::string& mask, int64_t sq, int64_t sk) {
  Case c = make_case(make_problem(1, 2, 1, sq, sk, 32, 24), 77);
  EXPECT_EQ(parse_mask(mask, c.problem), "");
  c.label = label;
  return c;
}

RunRecord sample_run() {
  RunRecord r;
  r.tool.name = "attn-check";
  r.tool.command = "attn-check --sweep --backend cpu --out reports/ --kernel 'flash*'";
  r.backend = "cpu";
  r.device = "cpu emulator (fibers)";
  r.seed = 5;
  r.started_at = "2025-01-01T00:00:00Z";
  r.wall_s = 1.5;
  auto entry = [&](const std::string& kernel, const Case& c, Verdict v, FailureClass f,
                   const std::string& reason) {
    RunEntry e;
    e.the_case = c;
    e.result.kernel = kernel;
    e.result.backend = "cpu";
    e.result.device = r.device;
    e.result.verdict = v;
    e.result.failure = f;
    e.result.reason = reason;
    e.result.compared = 13 * 2 * 24;
    return e;
  };
  const Case a = labelled("flash-7x13-causal-br", "causal-br", 7, 13);
  const Case b = labelled("masked-rows-40x9", "causal-br", 40, 9);
  r.entries.push_back(entry("flash-bk32", a, Verdict::kPass, FailureClass::kNone, ""));
  RunEntry bad = entry("broken<&\"kernel|x>", b, Verdict::kFail, FailureClass::kNonFinite,
                       "NaN in O where the oracle is finite (rows 0-30 | fully masked)");
  bad.result.max_ratio = INFINITY;
  bad.result.max_abs_err = NAN;
  bad.result.failed = 31 * 24;
  bad.result.evidence.push_back({"compare", "744 elements NaN, all in fully masked rows"});
  ElementReport w;
  w.b = 0;
  w.h = 1;
  w.s = 3;
  w.d = 5;
  w.expected = 0;
  w.got = NAN;
  w.bound = 1e-7;
  w.ratio = INFINITY;
  bad.result.worst.push_back(w);
  ElementReport l;
  l.is_lse = true;
  l.s = 3;
  l.expected = -INFINITY;
  l.got = 1.5;
  l.bound = 1e-6;
  l.ratio = INFINITY;
  bad.result.worst.push_back(l);
  bad.replay_command = "attn-check --replay reports/non-finite-0123456789abcdef.case --kernel 'broken'";
  bad.corpus_path = "reports/non-finite-0123456789abcdef.case";
  bad.heatmap_path = "heatmap-broken-0123456789abcdef.svg";
  r.entries.push_back(bad);
  r.entries.push_back(entry("flash-bk32", b, Verdict::kPass, FailureClass::kNone, ""));
  r.entries.push_back(entry("broken<&\"kernel|x>", a, Verdict::kUnsupported, FailureClass::kNone,
                            "mask causal-br not claimed"));
  r.entries.push_back(entry("flash-bk32", labelled("extreme-1e6", "none", 3, 3), Verdict::kOutsideContract,
                            FailureClass::kNone, "exact |s| exceeds the fp32 range"));
  return r;
}

// Issue 27 item 14: report files are replaced whole (temporary file, then rename), never rewritten in place: a
// second name of the old file (a hard link, or a reader holding it open) still sees the old text, and nothing is
// left beside the new file.
TEST(ReportFiles, WrittenWholeNeverInPlace) {
  const fs::path dir = fs::temp_directory_path() / ("attnfuzz-report-atomic-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path file = dir / "report.json", link = dir / "old-report.json";
  write_text_file(file, "old\n");
  fs::create_hard_link(file, link);
  write_text_file(file, "new\n");
  auto text = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  EXPECT_EQ(text(file), "new\n");
  EXPECT_EQ(text(link), "old\n") << "report.json was rewritten in place";
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.path() != link;
  EXPECT_EQ(entries, 1);  // no temporary file left
  EXPECT_THROW(write_text_file(dir / "old-report.json" / "x", "y"), ReportError);  // one reason, no crash
  fs::remove_all(dir);
}

TEST(JsonReport, SchemaFieldsPresent) {
  const RunRecord r = sample_run();
  const Json j = report_to_json(r);
  for (const char* k : {"schema", "schema_version", "tool", "backend", "device", "seed", "started_at",
                        "wall_s", "summary", "cases", "results"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["schema"], kReportSchemaName);
  EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
  EXPECT_EQ(j["tool"]["version"], ATTNFUZZ_VERSION);
  EXPECT_EQ(j["summary"]["fail"], 1);
  EXPECT_EQ(j["summary"]["pass"], 2);
  EXPECT_EQ(j["summary"]["unsupported"], 1);
  EXPECT_EQ(j["summary"]["outside_contract"], 1);
  EXPECT_EQ(j["summary"]["fail_by_class"]["non-finite"], 1);
  ASSERT_EQ(j["results"].size(), 5u);
  const Json& f = j["results"][1];
  for (const char* k : {"kernel", "case", "verdict", "class", "reason", "evidence", "worst", "max_ratio",
                        "max_abs_err", "baseline_max_ratio", "compared", "failed", "replay"})
    EXPECT_TRUE(f.contains(k)) << k;
  // Said once at the top, not per result (schema 2): the run's backend and device, the case by index.
  for (const char* k : {"backend", "device", "case_text", "seed"}) EXPECT_FALSE(f.contains(k)) << k;
  ASSERT_TRUE(f["case"].is_number_integer());
  EXPECT_EQ(f["verdict"], "fail");
  EXPECT_EQ(f["class"], "non-finite");
  EXPECT_EQ(f["max_ratio"], "inf");
  EXPECT_EQ(f["max_abs_err"], "nan");
  EXPECT_EQ(f["worst"][0]["got"], "nan");
  for (const char* k : {"tensor", "b", "h", "s", "d", "expected", "got", "bound", "ratio"})
    EXPECT_TRUE(f["worst"][0].contains(k)) << k;
  EXPECT_EQ(f["worst"][1]["tensor"], "lse");
  EXPECT_EQ(f["worst"][1]["expected"], "-inf");
  EXPECT_FALSE(j["results"][0].contains("class"));  // a pass has no class (and no empty fields)
  // The case in a report reads back as the same case.
  const Json& cj = j["cases"][f["case"].get<size_t>()];
  EXPECT_EQ(cj["text"], describe(r.entries[1].the_case));
  const Case back = case_from_json(cj);
  EXPECT_EQ(describe(back), describe(r.entries[1].the_case));
  EXPECT_EQ(back.label, "masked-rows-40x9");
  // It serialises (no NaN numbers JSON cannot hold) and parses again.
  const std::string text = report_json_text(j);
  EXPECT_EQ(Json::parse(text), j);
}

TEST(Markdown, FailuresFirstWithReplayAndHeatmap) {
  const std::string md = markdown_summary(sample_run());
  const size_t failures = md.find("## Failures (1)"), all = md.find("## All results");
  ASSERT_NE(failures, std::string::npos) << md;
  ASSERT_NE(all, std::string::npos);
  EXPECT_LT(failures, all);
  EXPECT_NE(md.find("non-finite"), std::string::npos);
  EXPECT_NE(md.find("`attn-check --replay reports/non-finite-0123456789abcdef.case --kernel 'broken'`"),
            std::string::npos);
  EXPECT_NE(md.find("[svg](heatmap-broken-0123456789abcdef.svg)"), std::string::npos);
  EXPECT_NE(md.find("broken\\<&\"kernel\\|x\\>"), std::string::npos) << "kernel name escaped for tables";
  // The verdict table: one row per case, one column per kernel, every verdict kind shown.
  const std::string table = md.substr(all);
  EXPECT_NE(table.find("| flash-7x13-causal-br | pass | - |"), std::string::npos) << table;
  EXPECT_NE(table.find("| masked-rows-40x9 | pass | **FAIL** non-finite |"), std::string::npos) << table;
  EXPECT_NE(table.find("| extreme-1e6 | n/c |"), std::string::npos) << table;
  EXPECT_NE(md.find("1 fail, 1 unsupported, 1 outside"), std::string::npos);
  // Each table row has the same number of cells as the header.
  std::istringstream lines(table);
  std::string line;
  int cols = -1;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '|') continue;
    int n = 0;
    for (size_t i = 0; i < line.size(); ++i) n += line[i] == '|' && (i == 0 || line[i - 1] != '\\');
    if (cols < 0) cols = n;
    EXPECT_EQ(n, cols) << line;
  }
}

TEST(JUnit, WellFormedWithFailuresAndSkips) {
  const std::string x = junit_xml(sample_run());
  EXPECT_EQ(xml_problem(x), "") << x;
  expect_xmllint_ok(x, "junit.xml");
  EXPECT_NE(x.find("<testsuites name=\"attn-check\" tests=\"5\" failures=\"1\" errors=\"0\" skipped=\"2\""),
            std::string::npos)
      << x;
  EXPECT_NE(x.find("<testsuite name=\"flash-bk32\" tests=\"3\" failures=\"0\""), std::string::npos);
  EXPECT_NE(x.find("<testsuite name=\"broken&lt;&amp;&quot;kernel|x&gt;\" tests=\"2\" failures=\"1\""),
            std::string::npos);
  EXPECT_NE(x.find("<failure type=\"non-finite\" message=\"non-finite: NaN in O"), std::string::npos);
  EXPECT_NE(x.find("<property name=\"failures-by-tier\" value=\"ordinary "), std::string::npos);  // issue 30
  EXPECT_NE(x.find(">tier: "), std::string::npos);
  EXPECT_NE(x.find("replay: attn-check --replay"), std::string::npos);
  EXPECT_NE(x.find("<skipped message=\"unsupported: mask causal-br not claimed\"/>"), std::string::npos);
  EXPECT_NE(x.find("<skipped message=\"outside-contract: exact"), std::string::npos);
}

RatioMap map_with(int64_t rows, int64_t cols) {
  RatioMap m(rows, cols, true);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t d = 0; d < cols; ++d) m.fold(i, d, 1e-3 * (1 + (i * 7 + d) % 50));
    m.fold_lse(i, 0.01);
  }
  return m;
}

TEST(Heatmap, FoldIsNanSafe) {
  RatioMap m(2, 2);
  EXPECT_EQ(m.at(0, 0), RatioMap::kNotCompared);
  m.fold(0, 0, NAN);
  m.fold(0, 0, 0.5);  // a later finite value must not hide the NaN (the std::max trap)
  EXPECT_TRUE(std::isinf(m.at(0, 0)));
  m.fold(0, 1, 0.5);
  m.fold(0, 1, 2.0);
  m.fold(0, 1, 1.0);
  EXPECT_EQ(m.at(0, 1), 2.0f);
  m.fold(9, 9, 1.0);  // out of range: ignored
  EXPECT_EQ(m.at(1, 1), RatioMap::kNotCompared);
}

TEST(Heatmap, WellFormedWithBoundTilesAndMask) {
  const Case c = labelled("tail-129x100-causal-br", "causal-br", 129, 100);
  RatioMap m = map_with(129, 24);
  m.fold(128, 23, 50.0);  // tail error
  m.fold(40, 3, NAN);     // mismatch
  m.fold_lse(128, 7.0);
  HeatmapOptions o;
  o.title = "flash-bk32: " + c.label + " <&>";
  o.subtitle = describe(c);
  const std::string svg = heatmap_svg(m, c.problem, o);
  EXPECT_EQ(xml_problem(svg), "") << svg.substr(0, 2000);
  expect_xmllint_ok(svg, "heatmap.svg");
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("1 = bound"), std::string::npos);
  EXPECT_NE(svg.find("flash-bk32: tail-129x100-causal-br &lt;&amp;&gt;"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#000000\""), std::string::npos) << "the NaN mismatch cell is black";
  EXPECT_NE(svg.find("query row i (Sq = 129)"), std::string::npos);
  EXPECT_NE(svg.find("head dim d of O (Dv = 24)"), std::string::npos);
  EXPECT_NE(svg.find(">LSE<"), std::string::npos);
  // Rows 0..28 are fully masked (Sq - Sk = 29): the gutter marks them and a dashed red line ends them.
  EXPECT_NE(svg.find("fill=\"#404040\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#d62728\""), std::string::npos);
  // Tile lines at rows 16 .. 128: 64, 128 thick; 32, 96 medium; 16, 48, 80, 112 thin.
  const std::string tiles =
      svg.substr(svg.find("<g id=\"tiles\""), svg.find("<g id=\"mask\"") - svg.find("<g id=\"tiles\""));
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(tiles, "stroke=\"#222222\" stroke-width=\"1.6\"/>"), 2u)
      << tiles;  // rows 64, 128 (cols < 64)
  EXPECT_EQ(count(tiles, "stroke=\"#444444\" stroke-width=\"1\"/>"), 2u);
  EXPECT_EQ(count(tiles, "stroke=\"#666666\" stroke-width=\"0.6\"/>"), 4u);
}

TEST(Heatmap, LargeMapsAreMaxPooledAndStaySmall) {
  const Case c = labelled("big", "window:100,0-tl", 4096, 4096);
  RatioMap m = map_with(4096, 256);
  m.fold(2049, 131, INFINITY);  // one mismatch must survive pooling
  HeatmapOptions o;
  o.title = "pooled";
  const std::string svg = heatmap_svg(m, c.problem, o);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("max-pooled: 16 row(s) x 2 column(s) per cell"), std::string::npos);
  const std::string cells =
      svg.substr(svg.find("<g id=\"cells\""), svg.find("</g>") - svg.find("<g id=\"cells\""));
  EXPECT_NE(cells.find("fill=\"#000000\""), std::string::npos);
  EXPECT_LT(svg.size(), 3u << 20);
}

TEST(Heatmap, DegenerateShapes) {
  for (auto [sq, sk, dv] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {5, 0, 16}, {1, 300, 1}}) {
    Case c = make_case(make_problem(1, 1, 1, sq, sk, 8, dv), 1);
    RatioMap m(sq, dv);  // nothing compared
    const std::string svg = heatmap_svg(m, c.problem, {});
    EXPECT_EQ(xml_problem(svg), "") << sq << "x" << sk;
    EXPECT_NE(svg.find("#d9d9d9"), std::string::npos);
    if (sk == 0) EXPECT_NE(svg.find("Sk = 0"), std::string::npos);
  }
}

TEST(Heatmap, PngNextToTheSvgWhenBuiltWithLibrsvg) {
  const Case c = labelled("tail-33x40-causal-br", "causal-br", 33, 40);
  RatioMap m = map_with(33, 16);
  m.fold(32, 15, 50.0);
  const std::string svg = heatmap_svg(m, c.problem, {});
  const fs::path dir = fs::temp_directory_path() / ("attnfuzz-png-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  EXPECT_EQ(write_heatmap_files(dir / "heatmap-k-0.svg", svg), "");
  EXPECT_TRUE(fs::exists(dir / "heatmap-k-0.svg"));
  if (!png_heatmaps_available()) {
    EXPECT_FALSE(fs::exists(dir / "heatmap-k-0.png"));
    EXPECT_NE(svg_to_png(svg, dir / "x.png"), "");
    fs::remove_all(dir);
    GTEST_SKIP() << "built without librsvg2-dev: SVG heatmaps only";
  }
  std::ifstream in(dir / "heatmap-k-0.png", std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  EXPECT_EQ(std::string(sig, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << "not a PNG";
  EXPECT_GT(fs::file_size(dir / "heatmap-k-0.png"), 1000u);
  EXPECT_NE(svg_to_png("<svg", dir / "bad.png"), "") << "a broken SVG is an error, not an empty PNG";
  fs::remove_all(dir);
}

TEST(Files, WriteReportsAndErrors) {
  const fs::path dir = fs::temp_directory_path() / ("attnfuzz-report-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const RunRecord r = sample_run();
  const ReportPaths p = write_reports(r, dir / "out");
  for (const fs::path& f : {p.json, p.markdown, p.junit}) EXPECT_TRUE(fs::exists(f)) << f;
  std::ifstream in(p.json);
  const Json j = Json::parse(in);
  EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
  const std::string name = heatmap_file_name("broken<&\"kernel|x>", r.entries[1].the_case);
  EXPECT_TRUE(std::regex_match(name, std::regex("heatmap-broken___kernel_x_-[0-9a-f]{16}\\.svg"))) << name;
  // A directory that cannot be created (a file is in the way).
  write_text_file(dir / "blocker", "x");
  EXPECT_THROW(write_reports(r, dir / "blocker" / "sub"), ReportError);
  try {
    write_text_file(dir / "blocker" / "sub" / "f.txt", "x");
  } catch (const ReportError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(Escapes, XmlAndMarkdown) {
  EXPECT_EQ(xml_escape("a<b>&\"'\x01"), "a&lt;b&gt;&amp;&quot;&apos;?");
  EXPECT_EQ(markdown_escape("a|b*c_d\ne"), "a\\|b\\*c\\_d e");
}

}  // namespace
}  // namespace attnfuzz
