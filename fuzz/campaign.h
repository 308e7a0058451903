// campaign.h - the attn-fuzz parent: runs libFuzzer workers in fork mode, shows progress, keeps the corpus,
// collects distinct failures and writes the summary; and the minimizer of one failing case.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fuzz/worker.h"

namespace attnfuzz::fuzz {

struct CampaignOptions {
  WorkerConfig worker;        // what every worker process does (backend resolved, out set)
  std::string worker_binary;  // attn-fuzz-worker
  std::string corpus_dir;     // the resumable corpus of .case files (read at start, grown during the run)
  std::vector<std::string> seed_dirs;  // read-only extra .case inputs (corpus/seed)
  unsigned workers = 1;                // libFuzzer jobs in total (-fork=N, split over GPU groups)
  double max_time_s = 0;               // 0: until interrupted (SIGINT / SIGTERM)
  bool stop_when_each_fails = false;   // stop once every selected kernel has a failure from this run
  double progress_s = 5;               // seconds between progress lines
  std::vector<std::string>
      gpu_ids;  // one worker group per id (HIP_/CUDA_VISIBLE_DEVICES); empty: one group, env untouched
  std::vector<std::string> fuzzer_args;  // extra libFuzzer flags
  std::string command_line;
  bool quiet = false;
  // --mps (nvidia): the workers are clients of a private CUDA MPS daemon (fuzz/mps.h); crash / hang verdicts
  // are re-run alone outside MPS before they count (WorkerConfig::mps)
  bool mps = false;
  // --sync DIR (fuzz/sync.h): publish / import corpus entries and distinct failures every sync_interval_s
  std::string sync_dir;
  std::string name;  // this campaign's name (in DIR and in merged summaries); default: the name of the run this
                     // OUT resumes (history.json), else <host>-<pid>
  int64_t max_failures = 1;   // distinct failures listed per kernel x class on the console; the rest counted
  bool all_failures = false;  // every one
  double sync_interval_s = 30;
  // Seconds, in all, for minimizing the new distinct failures after the workers end (campaign_minimize.cpp);
  // < 0: a tenth of max_time_s, at most 300 (30 without max_time_s); 0: none.
  double minimize_budget_s = -1;
  // --fail-tiers (report/tiers.h): the input tiers whose distinct failures make the exit status 1; failures
  // of the other tiers are still reported, marked as not counted.
  std::string fail_tiers = "all";
};

// Runs a campaign; returns the exit status (0 no failure, 1 distinct failures found, 2 error).
int run_campaign(const CampaignOptions& o);

struct MinimizeOptions {
  double max_time_s = 60;  // stop shrinking after this long (the best case so far is written)
  int max_checks = 5000;
  std::string out_dir;  // where the minimal case is written (<out>/minimized)
  bool quiet = false;
};
// The minimal case of a failure: its corpus file (the class, kernel and signature re-recorded), the checks and
// seconds spent, and the evidence kind it kept (decided_by).
struct Minimized {
  CorpusFile file;
  int checks = 0;
  double secs = 0;
  std::string decided_by;
  // When the time budget ended the shrinking before no step was left: what was not tried ("3 shape steps (~2.1 s
  // each) and 1 value step not tried"); empty when the case is a fixed point of the shrink steps.
  std::string left;
};

// The minimizer (fuzz/minimize.cpp): shrinks failing cases one after the other on one device, so that an adapter
// (one process; torch or jax imported once) serves every failure; the device is built again only when it died (a
// GPU context after a fault) or when a failure needs the other cpu launch mode (crash / hang: forked launches).
// Its time budget is a promise (fuzz/README.md "Minimize"): it is counted from the call, the device's start
// included, and a check is started only if the slowest check of its kind seen so far for the kernel (at a shape
// the device's process has run, or at a new one: a compilation) still fits in what is left; the first check of
// each kind is the only one not foreseen.
class Minimizer {
 public:
  explicit Minimizer(WorkerConfig cfg);
  ~Minimizer();
  // Shrinks cf's failing case (from `source`, a path for messages) while its kernel, class and the kind of evidence
  // that decided the class reproduce, for at most max_time_s / max_checks; `forked`: launch it forked on the cpu
  // backend (a kernel that killed a worker in-process). Returns an error sentence (not a failure, does not
  // reproduce, no such kernel, no time for even the first check) or empty with `out` filled.
  std::string minimize(const CorpusFile& cf, const std::string& source, double max_time_s, int max_checks,
                       Minimized& out, bool forked = false);
  int adapter_starts() const;  // adapter processes this minimizer started (restarts included)
  // Whether a device failed under a check (minimize() said so), or a GPU device became unusable: a CUDA / HIP
  // context that faulted stays faulted for the process.
  bool device_failed() const { return device_failed_; }

 private:
  // One kernel's checks so far: the slowest at a shape new to the device's process and at one it had run (seconds;
  // -1: none yet), and the shapes (shape_key) that process has run.
  struct KernelCost {
    double fresh = -1, repeat = -1;
    std::set<std::string> shapes;
    int process = -1;  // process() when `shapes` was filled
    double predict(bool new_shape) const;
  };
  Worker* worker(bool forked, std::string& err);
  std::string shrink(const CorpusFile& cf, const std::string& source, double max_time_s, int max_checks,
                     Minimized& out, bool forked);  // minimize() without its catch of a failed device
  int process() const;  // changes whenever a new device or adapter process starts (its compiled shapes are gone)
  WorkerConfig cfg_;
  std::unique_ptr<Worker> w_;
  bool w_forked_ = false;
  int builds_ = 0, retired_starts_ = 0;  // workers built; adapter starts of those before w_
  bool device_failed_ = false;
  std::map<std::string, KernelCost> costs_;
};

// minimize() of a Minimizer of its own (one failure: attn-fuzz --minimize, attn-check --bug-report --minimize).
std::string minimize_case(const CorpusFile& cf, const std::string& source, const WorkerConfig& cfg,
                          double max_time_s, int max_checks, Minimized& out);
// Shrinks the failing case of a corpus file (its recorded kernel and class must reproduce) and writes the
// minimal case; returns the exit status (0 written, 2 error or not reproducible).
int minimize_file(const std::string& path, const WorkerConfig& cfg, const MinimizeOptions& o);

// The campaign's minimize phase in its own process (fuzz/campaign_minimize.cpp): a worker process started with
// kMinimizeEnv runs this over the job file's failures from its "first" on, within its "budget_s", printing a progress
// line each, writing each minimal case and appending "<index> ok|not|device" per failure and "adapters <n>" at the
// end to the file named by "done". Returns 0, or kMinimizeFreshProcess when its device failed with failures left
// (the campaign starts a fresh process for them), or 2 for a job file that does not read.
inline constexpr int kMinimizeFreshProcess = 3;
int minimize_jobs(const WorkerConfig& cfg, const std::string& jobs_path);

// One step of the minimizer, for tests: the smallest case reachable from c by greedy shrinking while
// still_fails(candidate) holds, within a check budget. checks counts calls of still_fails. same_shape_first: the
// order for a kernel that compiles per shape (shrink_impl.h).
template <class Pred>
Case shrink_case(const Case& c, const CaseDomain& dom, Pred still_fails, int max_checks, int& checks,
                 bool same_shape_first = false);

}  // namespace attnfuzz::fuzz

#include "fuzz/shrink_impl.h"
