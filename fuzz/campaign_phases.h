// campaign_phases.h - the phases of an attn-fuzz campaign, one type or function each (run_campaign in
// campaign.cpp calls them in order); internal to fuzz/campaign*.cpp.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/campaign.h"
#include "fuzz/findings.h"
#include "fuzz/mps.h"
#include "fuzz/sync.h"
#include "report/tiers.h"

namespace attnfuzz::fuzz::campaign {

namespace fs = std::filesystem;

constexpr int kRssLimitMb = 4096;  // libFuzzer's -rss_limit_mb of a worker process

// Where a campaign keeps its files: OUT, its work/ folder, and the corpus.
struct Paths {
  explicit Paths(const CampaignOptions& o)
      : out(o.worker.out),
        work(out / "work"),
        inputs(work / "inputs"),
        artifacts(work / "artifacts"),
        failures(out / "failures"),
        corpus(o.corpus_dir) {}
  fs::path out, work, inputs, artifacts, failures, corpus;
  std::string quarantine() const { return (work / "quarantine.txt").string(); }  // kernels that hung
  std::string isolate() const { return (work / "isolate.txt").string(); }        // kernels launched forked
  std::string deaths() const { return (work / "deaths.txt").string(); }          // the workers' crash hook
};

using Kernels = std::vector<const KernelEntry*>;
using Env = std::vector<std::pair<std::string, std::string>>;

// Helpers the phases share (campaign.cpp).
std::string read_all(const fs::path& p);
std::vector<std::string> read_lines_all(const fs::path& p);  // every line, duplicates too
// work/found.txt: "<failure file> <found unix> <classified unix>" per failure saved (fuzz/worker.cpp save_failure, by
// a worker or by the parent for a worker that died), in the order written; a line not yet complete is left out.
struct FoundLine {
  std::string file;
  double found = 0, classified = 0;
};
std::vector<FoundLine> read_found(const Paths& p);
// The kernel a worker runs for an input (the selected one, or the next that supports the case and its pass).
const KernelEntry* kernel_for(const FuzzInput& in, const Kernels& ks,
                              const std::vector<std::string>& quarantined = {});
// The seconds from the start at which the workers are stopped (a little before --max-time, so that the
// summary is written by then); -1 without --max-time. The one rule for the parent and the workers' jobs.
double stop_after_s(double max_time_s);

// ------------------------------------------------------------- OUT: lock, reset, resume (campaign_out.cpp)

// Locks OUT for this campaign (one campaign per OUT) and writes this pid into the lock file; the
// descriptor stays open (and is inherited by every process of the campaign). false: said why on stderr.
bool lock_out(const Paths& p);
// Clears what the last run left in work/ and creates the campaign's folders. false: said why on stderr.
bool reset_work(const Paths& p);

struct Failure {
  fs::path path;
  CorpusFile file;
  // Its minimal case (OUT/minimized/<the same file name>, campaign_minimize.cpp), when it was minimized.
  fs::path minimal_path;
  std::optional<CorpusFile> minimal;
  // What a summary shows: the minimal case where there is one, else the failure as found.
  const CorpusFile& shown() const { return minimal ? *minimal : file; }
  const fs::path& shown_path() const { return minimal ? minimal_path : path; }
};
// Failure files that do not read (corrupted, truncated): kept in OUT untouched and listed in the summary.
struct Skipped {
  fs::path path;
  std::string why;
};
// The failure files of a failures/ folder (sorted by name), each with its minimal case from the minimized/ folder
// beside it where there is one; unreadable ones go to skipped, reported on stderr when report_skips.
std::vector<Failure> read_failures(const fs::path& dir, std::vector<Skipped>* skipped = nullptr,
                                   bool report_skips = true);
// Resume: the failures of earlier runs in OUT stay claimed, and a kernel that hung stays quarantined (a
// resumed campaign is the same campaign). Unreadable failure files are reported once and kept as they are.
void claim_earlier_failures(const Paths& p);

// ----------------------------------------------------------------- corpus in and out (campaign_corpus.cpp)

struct CorpusIn {
  std::set<std::string> known;  // input file names in work/inputs
  int64_t loaded = 0, skipped = 0, seeds = 0;
};
// Corpus in: every .case file of the corpus and seed directories becomes libFuzzer inputs in work/inputs; a
// file that does not read is reported and skipped.
CorpusIn load_corpus(const Paths& p, const std::vector<std::string>& seed_dirs, const Kernels& kernels,
                     const FuzzLimits& lim);

// Corpus out: new libFuzzer inputs become .case files of the corpus (labelled with the kernel they select).
class CorpusOut {
 public:
  CorpusOut(const Paths& p, const FuzzLimits& lim, const Kernels& kernels, std::string command_line,
            std::set<std::string> known)
      : p_(p),
        lim_(lim),
        kernels_(kernels),
        command_line_(std::move(command_line)),
        synced_(std::move(known)) {}
  void save_new();

 private:
  const Paths& p_;
  const FuzzLimits& lim_;
  const Kernels& kernels_;
  std::string command_line_;
  std::set<std::string> synced_;
};

// ------------------------------------------------------------- the worker processes (campaign_workers.cpp)

// libFuzzer's own counters from its log ("#N: cov: C ft: F corp: K exec/s E oom/timeout/crash: a/b/c").
struct FuzzerLine {
  int64_t ft = 0, corp = 0, ooms = 0, timeouts = 0, crashes = 0;
};

// Reads the lines libFuzzer appends to a log, and keeps its last counters.
class LogTail {
 public:
  explicit LogTail(fs::path p) : path_(std::move(p)) {}
  void poll(FuzzerLine& l);
  const std::string& last() const { return last_; }

 private:
  fs::path path_;
  size_t off_ = 0;
  std::string last_;
};

// Writes work/worker.json, what every worker process reads (the parent's stop time included); its path.
fs::path write_worker_config(const CampaignOptions& o, const Paths& p);
// libFuzzer's per-input timeout (-timeout), in seconds.
int libfuzzer_timeout_s(const WorkerConfig& cfg);
// Starts args[0] in its own process group, output to log (keep_stdout: stderr only, stdout is attn-fuzz's), env
// added (an empty value unsets); dies with attn-fuzz (PR_SET_PDEATHSIG).
pid_t spawn(const std::vector<std::string>& args, const Env& env, const fs::path& log, bool keep_stdout = false);

// The lifeline: attn-fuzz holds the only write end; every worker process watches the read end and kills its
// process group when it reads end-of-file (attn-fuzz died, even by SIGKILL).
struct Lifeline {
  int read = -1, write = -1;
  bool open();  // false: said why on stderr
  void close_read();
  void close_write();
  ~Lifeline();
};

// libFuzzer fork-mode scratch (its TempPath per fork-mode process): on /dev/shm unless TMPDIR is set; the
// directories of a campaign killed outright are removed by the next one on this OUT.
class ForkScratch {
 public:
  explicit ForkScratch(const Paths& p);  // chooses the folder and removes stale directories
  Env env() const;                       // TMPDIR for the workers, if it is not theirs
  fs::path of(pid_t master) const;
  void record(const std::vector<pid_t>& masters) const;  // work/fork-scratch.txt

 private:
  fs::path list_;
  std::string tmp_;
};

// The libFuzzer fork-mode processes, one per GPU group ("masters"; their fuzzing jobs are their descendants).
class FuzzerProcesses {
 public:
  struct Master {
    pid_t pid;
    fs::path log;
    std::unique_ptr<LogTail> tail;
    FuzzerLine line;
    int status = -1;
    bool done = false;
  };
  FuzzerProcesses(const CampaignOptions& o, const Paths& p);
  size_t groups() const { return groups_; }
  unsigned workers() const { return per_group_ * static_cast<unsigned>(groups_); }
  void start(const fs::path& cfg_path, int lifeline, const MpsDaemon* mps, const ForkScratch& scratch);
  // Waits for none; true when every master has ended (each then killed as a group, its scratch removed).
  bool reap();
  void interrupt_jobs();  // SIGINT to every fuzzing job (the orderly stop: its master then ends by itself)
  void kill_all();        // SIGKILL to every process group still running
  FuzzerLine poll();      // the sum of libFuzzer's counters over the masters
  // Reads the masters' last log lines; those that ended with an error, unless stopped by us, on stderr.
  void report_abnormal(bool stopped);
  std::string first_error() const;  // the first "ERROR:" line of the masters' logs

 private:
  const CampaignOptions& o_;
  const Paths& p_;
  const ForkScratch* scratch_ = nullptr;
  size_t groups_;
  unsigned per_group_;
  std::vector<Master> masters_;
};

// --mps: each suspect input (work/mps-suspects) is re-run alone by the worker binary, one at a time, outside
// MPS; see campaign_workers.cpp.
class MpsRechecks {
 public:
  MpsRechecks(const CampaignOptions& o, const Paths& p, fs::path cfg_path, int lifeline, int lf_timeout,
              bool enabled)
      : o_(o),
        p_(p),
        cfg_path_(std::move(cfg_path)),
        lifeline_(lifeline),
        lf_timeout_(lf_timeout),
        enabled_(enabled) {}
  bool step();   // true while a re-run is in flight or waiting
  void drain();  // after the workers: the suspects left are re-run (bounded); counts those not re-run
  int64_t rechecked() const { return rechecked_; }
  int64_t pending() const { return pending_; }

 private:
  const CampaignOptions& o_;
  const Paths& p_;
  fs::path cfg_path_;
  int lifeline_, lf_timeout_;
  bool enabled_;
  pid_t pid_ = -1;
  fs::path input_;
  std::chrono::steady_clock::time_point started_;
  int64_t rechecked_ = 0, pending_ = 0;
};

// ------------------------------------------- worker deaths: artifacts and accounting (campaign_deaths.cpp)

// libFuzzer artifacts: inputs that killed a worker process (a kernel that crashed or hung in-process). Each
// becomes a crash or hang failure like any other, and its kernel is launched isolated from then on.
class ArtifactScanner {
 public:
  ArtifactScanner(const CampaignOptions& o, const Paths& p, const Kernels& kernels, int lf_timeout, bool mps)
      : o_(o), p_(p), kernels_(kernels), lf_timeout_(lf_timeout), mps_(mps) {}
  void scan();
  int64_t crashes() const { return crashes_; }  // worker processes that died, as libFuzzer saved them
  int64_t hangs() const { return hangs_; }
  const std::map<std::string, int64_t>& ended_by() const { return ended_by_; }  // what ended them

 private:
  void take(const std::string& name);
  std::vector<std::string> fault_of(const std::string& bytes);
  const CampaignOptions& o_;
  const Paths& p_;
  const Kernels& kernels_;
  int lf_timeout_;
  bool mps_;
  std::set<std::string> seen_, isolated_;
  int64_t crashes_ = 0, hangs_ = 0;
  std::vector<bool> fault_taken_;  // lines of work/faults.txt already matched to an artifact
  std::map<std::string, int64_t> ended_by_;
};

// Worker processes that died: libFuzzer's counts, or the artifacts it saved if more (its counters lag),
// plus the processes the hang watchdog ended (work/deaths.txt).
struct WorkerDeaths {
  int64_t crashes = 0, hangs = 0, lf_timeouts = 0;
};
WorkerDeaths count_deaths(const FuzzerLine& lf, const ArtifactScanner& artifacts, const Paths& p);
// What ended each worker process that died: the artifacts (kernel and class), the hang watchdog, and what
// libFuzzer counted beyond them (a job that exited non-zero without an artifact, with its ERROR line).
std::map<std::string, int64_t> death_reasons(const WorkerDeaths& d, const ArtifactScanner& artifacts,
                                             const Paths& p, const FuzzerProcesses& fuzzers);

// ------------------------------------------------------------ statistics, progress (campaign_progress.cpp)

struct Aggregate {
  int64_t cases = 0, failing = 0;  // cases: inputs checked on a kernel
  int64_t skipped = 0;             // inputs that no selected kernel ran (unsupported by all, or quarantined)
  int64_t replayed = 0;            // libFuzzer re-runs of kept inputs answered from the feature cache
  double check_s = 0, mutate_s = 0;              // worker processes' time in checks and in the custom mutator
  std::map<std::string, double> kernel_check_s;  // the checks' time per kernel
  std::map<std::string, double> phase_s;         // the checks' time per phase (Worker::phase_s_)
  double kernel_s = 0;          // the device's own time of the checks' launches, part of phase_s["launch"]
  int64_t buffer_calls = 0;     // the guarded buffers' device calls in checks (Worker::buffer_calls_)
  std::map<std::string, int64_t> verdicts, classes;
  std::map<std::string, int64_t> refusals;  // "kernel: why it refused an input" -> count
  std::map<std::string, std::map<std::string, int64_t>> kernels;
  // kernel -> "PASS DTYPE" -> verdict or "refused" -> count (the per-kernel table)
  std::map<std::string, std::map<std::string, std::map<std::string, int64_t>>> by_kernel;
  // Compile-aware fuzzing (fuzz/shape_pool.h), per kernel whose pool was not off in some worker process: its mode
  // and why ("pooled" wins over "probe" and "off"), and the processes' ShapePool::stats() summed.
  struct CompileTotals {
    std::string mode, why;
    int64_t shapes = 0, checks = 0, snapped = 0, refused = 0, processes = 0;
    double new_shape_s = 0, check_s = 0;
  };
  std::map<std::string, CompileTotals> compile;
  int64_t features = 0;
  std::string features_hex;  // the union bitmap (merged summaries take the union over campaigns)
};
// The sum of the worker processes' statistics files (work/stats/*.json).
Aggregate read_stats(const fs::path& dir);

// Seconds since the workers started.
struct Clock {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// The progress line ("attn-fuzz [   35s] cases ..."); also counts the worker processes that died.
class Progress {
 public:
  Progress(const Paths& p, const Clock& clock) : p_(p), clock_(clock) {}
  Aggregate print(bool final, FuzzerProcesses& fuzzers, const ArtifactScanner& artifacts);
  const WorkerDeaths& deaths() const { return deaths_; }  // as of the last line

 private:
  const Paths& p_;
  const Clock& clock_;
  WorkerDeaths deaths_;
};

// ---------------------------------------------------------------------------- the stop (campaign_stop.cpp)

// How a campaign stops: at --max-time (stop_after_s), on SIGINT / SIGTERM / SIGHUP, when every selected
// kernel is quarantined, or (--stop-when-each-fails) when each has a failure from this run or is quarantined.
// Every fuzzing job gets SIGINT (libFuzzer's orderly exit), every process group SIGKILL after a short grace.
class Stop {
 public:
  Stop(const CampaignOptions& o, const Paths& p, const Kernels& kernels);  // installs the signal handlers
  void restore_signals();  // the handlers from before (after the workers have ended)
  void step(const Clock& clock, FuzzerProcesses& fuzzers);  // one supervision tick: decide, signal
  bool stopping() const { return stopping_; }
  bool interrupted() const { return interrupted_; }  // by a signal

 private:
  bool every_kernel_in(const std::set<std::string>& or_these) const;  // quarantined, or one of or_these
  bool each_failed();  // reads the lines of work/found.txt it has not read yet
  void begin(const Clock& clock, FuzzerProcesses& fuzzers, const char* why);  // the stop; why: printed if set
  const Paths& p_;
  const Kernels& kernels_;
  double stop_at_;
  bool stop_when_each_fails_;
  size_t found_lines_ = 0;                   // of read_found(), read so far
  std::set<std::string> failed_;             // kernels with a failure of this run
  bool stopping_ = false, interrupted_ = false;
  double kill_at_ = -1;
  struct sigaction old_int_ {
  }, old_term_{}, old_hup_{};  // the handlers before
};

// ------------------------------------------------ history across runs of one OUT (campaign_history.cpp)

// OUT/history.json: the campaign's name, its runs, and when each distinct failure was found and its class
// known (from the workers' work/found.txt; a failure without a line there is timed by its file, marked so).
// A resume reads it, so the name, the campaign's clock and the failures' times carry over.
struct FailureTimes {
  double found_unix = 0, classified_unix = 0;
  double found_after_s = 0, classified_after_s = 0;  // campaign time: earlier runs' wall + this run's seconds
  int run = 0;                                       // 1 = the first run of this OUT
  bool from_file_time = false;
};
struct History {
  std::string name;
  struct Run {
    std::time_t started_unix = 0;
    double wall_s = 0;
    int64_t cases = 0, failing = 0;
    bool interrupted = false;
  };
  std::vector<Run> runs;                        // earlier runs, then this one (added by record_run)
  std::map<std::string, FailureTimes> failures;  // failure file name -> times
  double earlier_wall() const;                   // campaign time before this run
  std::time_t first_started() const;
};
// The history of OUT so far (empty for a new OUT; a campaign from before history.json: its report's name).
History read_history(const Paths& p);
// Adds this run (started, wall, cases) and the times of the failures in failures/ not yet timed; writes it.
void record_run(const Paths& p, History& h, const History::Run& run, const std::vector<Failure>& found);

// ------------------------------------------------------ minimizing the distinct failures (campaign_minimize.cpp)

// Shrinks every distinct failure in `found` that has no minimal case yet (hangs excepted: each step would wait
// --timeout; attn-fuzz --minimize does them), ordinary inputs first, within o.minimize_budget_s in all, and
// writes each minimal case to OUT/minimized/<the failure's file name>; a progress line per failure.
void minimize_failures(const CampaignOptions& o, const Paths& p, const std::vector<std::string>& isolated,
                       std::vector<Failure>& found);

// ---------------------------------------------------------------------- the summary (campaign_summary.cpp)

// What the summary reports, gathered after the workers have ended.
struct Outcome {
  std::string name;
  std::time_t started_unix = 0;
  double wall = 0;
  bool interrupted = false;
  Aggregate stats;
  WorkerDeaths deaths;
  std::map<std::string, int64_t> ended;  // what ended worker processes -> count
  std::vector<Failure> found;            // the distinct failures in failures/
  std::vector<Skipped> skipped;          // unreadable failure files
  std::vector<std::string> quarantined, isolated;
  bool synced = false;  // --sync
  SyncTotals sync;
  std::vector<ImportedFailure> imported;
  bool mps = false;
  int64_t mps_rechecked = 0, mps_pending = 0;
  std::vector<std::string> kernels;  // the selected kernels (a kernel that got no check is listed loudly)
  History history;                   // this run included
  int64_t max_failures = 1;          // failures listed per kernel x class on the console (all_failures: every one)
  bool all_failures = false;
  // Filled by write_summary from `found`: each failure's input tier (of its shown case: the minimal one where there
  // is one) and the failures grouped into findings.
  std::vector<InputTier> tiers;
  std::vector<Finding> findings;
  TierTally tally;  // the tiers counted per tier, and those --fail-tiers counts
};
// "B=1 H=2/1 7x13 D=59 causal-br" (+ the layout): a failure's shape in summary tables.
std::string shape(const Problem& p);
// Fills r.tiers and r.findings, prints the summary, writes summary.md, report.json and junit.xml; returns the exit
// status.
int write_summary(const CampaignOptions& o, const Paths& p, Outcome& r);

}  // namespace attnfuzz::fuzz::campaign
