// report.h - a run's record and its writers: JSON report, Markdown summary, SVG heatmap, JUnit XML.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnfuzz/case.h"
#include "attnfuzz/corpus.h"
#include "attnfuzz/verdict.h"

namespace attnfuzz {

// Bumped on any incompatible change of the JSON report (fields removed or changing meaning).
// 2: each case once in "cases" (results[].case is its index; case_text is cases[].text), backend / device at
// the top only, empty fields left out; 1 is read by --merge too (its campaign section is the same).
inline constexpr int kReportSchemaVersion = 2;
inline constexpr const char* kReportSchemaName = "attnfuzz-report";

// One kernel x case check of a run.
struct RunEntry {
  Case the_case;
  CheckResult result;          // kernel, backend, device, verdict, class, evidence, worst elements
  std::string replay_command;  // one line, e.g. "attn-check --replay reports/non-finite-....case --kernel k"
  std::string corpus_path;     // saved corpus file (empty if none), as the user should type it
  std::string heatmap_path;    // SVG heatmap relative to the report directory (empty if none)
};

// Everything a report says about one run.
struct RunRecord {
  ToolInfo tool;           // name ("attn-check"), version, command line
  std::string backend;     // "cpu", "nvidia", "amd"
  std::string device;      // e.g. "cpu emulator (fibers, 2 threads)" or "NVIDIA H200"
  uint64_t seed = 0;       // the run's base seed (each case carries its own too)
  std::string started_at;  // ISO 8601 UTC, may be empty
  double wall_s = 0;       // whole run
  std::vector<RunEntry> entries;
};

// Counts by verdict, and failures by class.
struct RunCounts {
  int64_t pass = 0, fail = 0, unsupported = 0, outside_contract = 0;
};
RunCounts count(const RunRecord& r);

// --- JSON (schema: corpus/README.md "Reports"): {"schema", "schema_version", "tool", "backend", ...,
// "summary", "cases": [{label, problem, values, seed, text}], "results": [{kernel, case (index into cases),
// verdict, class, evidence, worst, replay, ...}]}: what every result shares is said once.
Json report_to_json(const RunRecord& r);
// One result; case_index null: the case inline (case_text, case), else that index. With run: backend and
// device only where they differ from the run's.
Json entry_to_json(const RunEntry& e, const Json& case_index, const RunRecord* run);
// The report's text: pretty at the top, one line per case and per result.
std::string report_json_text(const Json& j);
Json element_to_json(const ElementReport& e);

// --- Markdown: header, counts, failures first (class, ratio, replay, heatmap link, evidence, worst
// elements), then a case x kernel verdict table.
std::string markdown_summary(const RunRecord& r);

// --- JUnit XML: one <testsuite> per kernel, one <testcase> per case; failures carry the class as
// type and a one-line message; unsupported and outside-contract are <skipped>.
std::string junit_xml(const RunRecord& r);

// --- SVG heatmap of |err| / bound over (query row x head dim of O) for one failing case.
//
// ratio[row * cols + col]: the largest ratio seen at that (row, d) over whatever the caller folded in
// (typically every batch and head), +inf for a NaN/Inf mismatch, kNotCompared where the element was
// not checked (sampled rows). Use fold() to fill it: it is a NaN-safe max (NaN counts as +inf).
struct RatioMap {
  static constexpr float kNotCompared = -1.0f;
  int64_t rows = 0, cols = 0;
  std::vector<float> ratio;      // rows * cols
  std::vector<float> lse_ratio;  // empty, or rows: the LSE's ratio per query row (drawn as a side column)
  RatioMap() = default;
  RatioMap(int64_t rows, int64_t cols, bool with_lse = false);
  float at(int64_t row, int64_t col) const { return ratio[static_cast<size_t>(row * cols + col)]; }
  void fold(int64_t row, int64_t col, double r);
  void fold_lse(int64_t row, double r);
};

struct HeatmapOptions {
  std::string title;       // e.g. "flash-bk32: tail-65x65-causal-br"
  std::string subtitle;    // e.g. describe(case); max ratio; which b/h were folded
  int64_t max_rows = 256;  // larger maps are max-pooled down to at most this many cells per axis
  int64_t max_cols = 128;
};
// The problem supplies Sq, Sk, Dv and the mask (drawn beside the rows).
std::string heatmap_svg(const RatioMap& map, const Problem& p, const HeatmapOptions& opt);
// PNG heatmaps (report/png.cpp): available when built with librsvg (CMake ATTNFUZZ_PNG, librsvg2-dev).
bool png_heatmaps_available();
// Renders an SVG into a PNG file; returns empty on success, else why not (also when not available).
std::string svg_to_png(const std::string& svg, const std::filesystem::path& png);

// --- Bounded console output (report/console.cpp): the tools show the first failures of each kernel x class
// with the evidence that decided the class, and count the rest (report.json lists every one).
// The lines of the detector that decided r's class (the classify line's "CLASS by DETECTOR"; when no detector
// decided, every detector's but the advisory / background ones): of each its first line and its last.
std::vector<const Evidence*> deciding_evidence(const CheckResult& r);
// Failures counted per (kernel, class), in the order each pair first failed.
class FailureTally {
 public:
  // Counts one failure; returns how many of this pair came before it (0: the first).
  int64_t add(const std::string& kernel, const std::string& cls);
  int64_t count(const std::string& kernel, const std::string& cls) const;
  int64_t total() const;
  size_t groups() const { return order_.size(); }
  size_t kernels() const;
  const std::vector<std::pair<std::string, std::string>>& order() const { return order_; }
  // "12 failures in 3 kernel x class pairs (2 kernels); start with: KERNEL CLASS: REPLAY"
  std::string headline(const std::string& start_kernel, const std::string& start_class,
                       const std::string& start_replay) const;

 private:
  std::map<std::pair<std::string, std::string>, int64_t> seen_;
  std::vector<std::pair<std::string, std::string>> order_;
};

// --- files
class ReportError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Writes text to path (creating parent directories). Throws ReportError with a one-line message.
void write_text_file(const std::filesystem::path& path, const std::string& text);
// Writes a heatmap's SVG to svg_path (throws ReportError like write_text_file) and, where PNG heatmaps are
// available, the same picture next to it as .png (for terminals and viewers without SVG). Returns empty, or
// why the PNG could not be written (the SVG stands).
std::string write_heatmap_files(const std::filesystem::path& svg_path, const std::string& svg);

struct ReportPaths {
  std::filesystem::path json, markdown, junit;
};
// Writes report.json, summary.md and junit.xml into dir. Heatmaps are written by the caller (it owns
// the ratio maps) with write_heatmap_files(dir / heatmap_file_name(...), heatmap_svg(...)).
ReportPaths write_reports(const RunRecord& r, const std::filesystem::path& dir);
// "heatmap-<kernel>-<hash16>.svg" (kernel name made file-safe; hash of the case content).
std::string heatmap_file_name(const std::string& kernel, const Case& c);

// Escapes for the text formats (exposed for tests and other writers).
std::string xml_escape(const std::string& s);
std::string markdown_escape(const std::string& s);

}  // namespace attnfuzz
