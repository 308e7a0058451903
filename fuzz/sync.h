// sync.h - campaigns beyond one machine: a shared directory through which campaigns publish and import
// corpus entries and distinct failures (attn-fuzz --sync), and the merge of many campaign outputs into one
// summary (attn-fuzz --merge).
//
// Layout of the sync directory DIR (a shared file system; no daemon, no network code: files only):
//   DIR/<campaign>/corpus/<name>.case            corpus entries the campaign found (corpus format)
//   DIR/<campaign>/failures/<class>-<hash>.case  distinct failures it found itself; the file's mtime is the
//                                                moment it was found (set before publishing); beside it the
//                                                failure's <stem>.json report and <stem>.svg heatmap
// Every file appears whole: written under a temporary name starting with '.' in the same directory, then
// renamed (atomic on POSIX and NFS). Readers skip names starting with '.'; a failure's sidecars are
// renamed into place before its .case file, so a visible .case has its report beside it.
//
// In a campaign directory OUT, sync adds:
//   OUT/imported/<campaign>/<class>-<hash>.case  distinct failures first found by another campaign (claimed
//                                                in OUT/work/dedup, so local workers do not save them again)
//   OUT/work/sync-in/<hash>                      imported corpus entries as fuzzer inputs, not yet run; a
//                                                worker takes one (rename into sync-in/taken/) and offers it
//                                                to libFuzzer as its next mutation (take_synced_input)
#pragma once

#include <cstdint>
#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attnfuzz/corpus.h"
#include "fuzz/codec.h"

namespace attnfuzz::fuzz {

// "<host>-<pid>": the default campaign name.
std::string default_campaign_name();
// "" or why a campaign name is unusable (a file name: letters, digits, '.', '_', '-'; not starting with '.').
std::string campaign_name_problem(const std::string& name);
// "" or why DIR cannot be a sync directory (created if missing; must be a writable directory).
std::string sync_dir_problem(const std::string& dir);

// The (kernel, class, signature) dedup key of a recorded failure (the name of its OUT/work/dedup claim).
std::string failure_key(const RecordedVerdict& v);

// Writes text to dir/name atomically: a temporary ".<name>.<host>.<pid>.<n>" in dir, then rename. mtime,
// when given, is set on the file before it becomes visible. Returns false (and removes the temporary) on
// any error.
bool publish_file(const std::filesystem::path& dir, const std::string& name, const std::string& text,
                  const struct timespec* mtime = nullptr);

struct SyncConfig {
  std::filesystem::path dir;     // the shared sync directory
  std::string name;              // this campaign's name
  std::filesystem::path out;     // the campaign directory (failures/, imported/, work/)
  std::filesystem::path corpus;  // the campaign's corpus of .case files
  FuzzLimits limits;             // imported cases are normalised into these (fuzzer inputs)
  // Maps a corpus case to the fuzzer input of the kernel it should select (the campaign's kernel_index_of).
  std::vector<std::string> kernels;
  bool quiet = false;
};

struct ImportedFailure {
  std::string from;               // the campaign that found it
  std::filesystem::path path;     // OUT/imported/<from>/<file>
  RecordedVerdict verdict;
  Case the_case;
  std::time_t found_at = 0;       // when <from> found it (seconds since the epoch)
};

struct SyncTotals {
  int64_t published_corpus = 0, published_failures = 0;
  std::map<std::string, int64_t> imported_corpus;  // per campaign
  int64_t imported_inputs_run = 0;                 // imported corpus entries the local workers ran
  int64_t rounds = 0;
  double seconds = 0;                              // wall time spent in rounds
  double cpu_seconds = 0;                          // CPU time of the parent in rounds
};

class Sync {
 public:
  // Creates DIR/<name>/{corpus,failures} and locks DIR/<name>/.lock until destroyed; throws std::runtime_error
  // with one line on failure, or when another campaign with this name holds the lock.
  explicit Sync(SyncConfig c);
  ~Sync();
  Sync(const Sync&) = delete;
  Sync& operator=(const Sync&) = delete;
  // At campaign start, before the corpus is loaded: claims the failures imported earlier (resume) in
  // OUT/work/dedup, then imports what the other campaigns published so far.
  void start();
  // One round: publishes new local corpus entries and distinct failures, imports the others'.
  void round();
  SyncTotals totals() const;
  // Every failure imported into OUT (this run and earlier ones), sorted by file name.
  std::vector<ImportedFailure> imported_failures() const;
  const SyncConfig& config() const { return c_; }

 private:
  void publish();
  void import();
  SyncConfig c_;
  std::filesystem::path mine_;
  int lock_fd_ = -1;  // DIR/<name>/.lock, locked
  std::set<std::string> corpus_seen_;    // corpus names published (by anyone) or imported
  std::set<std::string> failures_seen_;  // "<campaign>/<file>" of other campaigns' failures looked at
  std::set<std::string> published_failures_;
  SyncTotals t_;
};

// Worker side: an imported corpus entry not yet run (taken from OUT/work/sync-in, at most one look a
// second), as fuzzer input bytes of at most max_size; nullopt when none.
std::optional<std::vector<uint8_t>> take_synced_input(const std::string& out, size_t max_size);

// attn-fuzz --merge: one summary over many campaign directories (their OUT): distinct failures
// deduplicated by (kernel, class, signature), each with who found it first and when, its input tier (of its
// campaign's minimal case where there is one), ordinary first, and per-campaign statistics; writes
// OUT/summary.md, report.json, junit.xml, failures/ (cases and heatmaps). Returns the exit status (0 no
// failure, 1 distinct failures in a tier fail_tiers counts (report/tiers.h), 2 bad input).
int merge_campaigns(const std::vector<std::string>& dirs, const std::string& out,
                    const std::string& command_line, bool quiet, const std::string& fail_tiers = "all");

}  // namespace attnfuzz::fuzz
