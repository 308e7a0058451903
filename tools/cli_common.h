// cli_common.h - what attn-check and attn-fuzz share: device/kernel options, session set-up, checking and reporting.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "attnfuzz/corpus.h"
#include "attnfuzz/device.h"
#include "attnfuzz/registry.h"
#include "attnfuzz/report.h"
#include "check/classify.h"
#include "check/runner.h"

namespace attnfuzz {

// Options every tool has (one table: add_common_options).
struct CommonOptions {
  std::string kernel = "all";          // names or globs, comma separated
  std::string backend = "auto";
  std::vector<std::string> plugins;
  std::string adapter;                 // --adapter CMD: kernels of an external process (adapters/PROTOCOL.md)
  std::string out = "reports";
  std::string order = "shuffle";       // cpu emulator thread order (shuffle: a missing barrier shows either way)
  uint64_t order_seed = 1;
  unsigned workers = 0;
  unsigned warp_size = 32;
  double timeout_s = 30;
  bool no_isolate = false;
  int64_t oracle_rows = 0;             // 0 = every row; else a sampled budget
  int mp_bits = 128;
  bool quiet = false;
  bool no_reports = false;
  // failure classification (check/classify.h)
  bool no_classify = false;
  int reruns = 5;                        // GPU bitwise reruns of a failing case
  bool tsan = false;                     // cpu: re-run failing cases in the TSan build of attn-check
  std::string tsan_binary;
  std::vector<std::string> tsan_plugins;
  bool compute_sanitizer = false;        // nvidia: racecheck / synccheck / memcheck on failing cases
};
void add_common_options(CLI::App& app, CommonOptions& o);
// " --adapter 'CMD'" when o names one (replay commands), else empty.
std::string adapter_flag(const CommonOptions& o);

struct Session {
  std::string tool;                    // "attn-check"
  std::string command_line;
  CommonOptions opts;
  Registry* registry = nullptr;
  std::unique_ptr<Device> device;
  RunOptions run;
  ClassifyOptions classify;
};
// Loads plug-ins, opens the device, checks --out is writable. Exits 2 with a message on bad input.
Session open_session(const CommonOptions& o, const std::string& tool, int argc, char** argv);
void list_kernels(const Session& s);

// Runs checks one after another, prints progress and verdicts, saves failing cases into <out>/corpus,
// and at the end prints the summary table and writes the reports.
class Runner {
 public:
  Runner(Session& s, const CommonOptions& o);
  void begin(int64_t total_checks);
  const Judged& check(const KernelEntry& k, PreparedCase& pc, const std::string& origin);
  // Records a check judged elsewhere (outputs read from NPY files) exactly like check(): verdict line,
  // heatmap, report entry. A non-empty replay_command is printed as the failure's replay line and the
  // case is not saved to the corpus (its inputs are files, not a generated case).
  const Judged& record(const Case& the_case, Judged judged, const std::string& replay_command);
  // Prints the summary, writes the reports; returns the exit code (0 all pass, 1 any failure).
  int finish();
  const std::vector<RunEntry>& entries() const { return entries_; }

 private:
  void progress(bool final);
  std::string write_heatmap(const RunEntry& e, const std::vector<double>& ratio_map);
  Session& s_;
  CommonOptions o_;
  std::vector<RunEntry> entries_;
  Judged last_;
  int64_t total_ = 0, done_ = 0, failures_ = 0;
  std::chrono::steady_clock::time_point start_, last_progress_;
  bool tty_ = false;
};

}  // namespace attnfuzz
