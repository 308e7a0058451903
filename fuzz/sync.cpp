// sync.cpp - attn-fuzz --sync (publish / import of corpus entries and distinct failures through a shared
// directory, atomic renames only) and attn-fuzz --merge (one deduplicated summary over many campaigns).
#include "fuzz/sync.h"

#include "fuzz/findings.h"

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "attnfuzz/report.h"
#include "fuzz/worker.h"
#include "report/tiers.h"

namespace fs = std::filesystem;

namespace attnfuzz::fuzz {

namespace {

double cpu_seconds() {  // this process (the campaign parent is single-threaded: the rounds' own CPU time)
  struct timespec t {};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::string hex16(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

std::string host_name() {
  char h[256] = {0};
  if (::gethostname(h, sizeof h - 1) != 0 || !*h) return "host";
  std::string s = h;
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
  return s;
}

// Names a reader looks at: final names only (temporaries start with '.').
bool visible(const fs::path& p) {
  const std::string n = p.filename().string();
  return !n.empty() && n[0] != '.';
}

std::vector<fs::path> list(const fs::path& dir, const std::string& ext) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (!visible(e.path()) || !e.is_regular_file(ec2)) continue;
    if (ext.empty() || e.path().extension() == ext) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<fs::path> subdirs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (visible(e.path()) && e.is_directory(ec2)) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool read_text(const fs::path& p, std::string& out) {
  return read_regular_file(p, kMaxCorpusFileBytes, out).empty();
}

bool mtime_of(const fs::path& p, struct timespec& t) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return false;
  t = st.st_mtim;
  return true;
}

std::string iso_utc(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

// The sidecars of a failure file that travel with it (its report, SVG and PNG heatmap), then the file.
const char* const kSidecars[] = {".json", ".svg", ".png"};

// Copies a failure (sidecars first, the .case last, mtime kept) from one directory to another.
bool copy_failure(const fs::path& src_case, const fs::path& dst_dir, const std::string& case_text) {
  struct timespec t {};
  const bool have_t = mtime_of(src_case, t);
  const std::string stem = src_case.stem().string();
  for (const char* ext : kSidecars) {
    std::string side;
    const fs::path sp = src_case.parent_path() / (stem + ext);
    if (read_text(sp, side)) publish_file(dst_dir, stem + ext, side, have_t ? &t : nullptr);
  }
  return publish_file(dst_dir, src_case.filename().string(), case_text, have_t ? &t : nullptr);
}

void claim(const fs::path& dedup, const std::string& key, const RecordedVerdict& v, bool exclusive,
           bool* claimed) {
  const int fd = ::open((dedup / key).c_str(), O_CREAT | O_WRONLY | (exclusive ? O_EXCL : O_TRUNC), 0644);
  if (claimed) *claimed = fd >= 0;
  if (fd < 0) return;
  const std::string line = v.kernel + " " + failure_class_name(v.failure) + " " + v.signature + "\n";
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}

// Reads and parses a case file another campaign published: false when it cannot be read yet or is corrupt
// (said on stderr unless quiet), so the caller skips it.
bool read_case_file(const fs::path& f, bool quiet, std::string& text, CorpusFile& cf) {
  try {
    if (!read_text(f, text)) return false;
    cf = parse_corpus(text, f.string());
    return true;
  } catch (const CorpusError& e) {
    if (!quiet) std::fprintf(stderr, "attn-fuzz: sync: skipping %s\n", e.what());
    return false;
  }
}

}  // namespace

std::string default_campaign_name() { return host_name() + "-" + std::to_string(::getpid()); }

std::string campaign_name_problem(const std::string& name) {
  if (name.empty()) return "a campaign name must not be empty";
  if (name[0] == '.') return "'" + name + "': a campaign name must not start with '.'";
  if (name.size() > 128) return "'" + name + "': a campaign name has at most 128 characters";
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return "'" + name + "': a campaign name has only letters, digits, '.', '_' and '-'";
  return {};
}

std::string sync_dir_problem(const std::string& dir) {
  if (dir.empty()) return "'' is empty: need a directory (created if missing)";
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) return dir + ": not a directory";
  fs::create_directories(dir, ec);
  if (ec) return dir + ": cannot create the directory: " + ec.message();
  const fs::path probe = fs::path(dir) / (".write-test." + default_campaign_name());
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) return dir + ": not writable: " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

std::string failure_key(const RecordedVerdict& v) {
  return hex16(hash64(v.kernel + "|" + failure_class_name(v.failure) + "|" + v.signature));
}

bool publish_file(const fs::path& dir, const std::string& name, const std::string& text,
                  const struct timespec* mtime) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  return write_file_atomically(dir / name, text, mtime).empty();
}

// ------------------------------------------------------------------------------------------------ Sync

Sync::Sync(SyncConfig c) : c_(std::move(c)) {
  if (std::string why = campaign_name_problem(c_.name); !why.empty()) throw std::runtime_error(why);
  if (std::string why = sync_dir_problem(c_.dir.string()); !why.empty()) throw std::runtime_error(why);
  mine_ = c_.dir / c_.name;
  std::error_code ec;
  for (const fs::path& d : {mine_ / "corpus", mine_ / "failures", c_.out / "imported",
                            c_.out / "work" / "sync-in" / "taken"}) {
    fs::create_directories(d, ec);
    if (ec) throw std::runtime_error(d.string() + ": cannot create the directory: " + ec.message());
  }
  // One campaign per name: DIR/<name>/.lock is locked (flock; NFS and Lustre map it to their own locks) for as
  // long as this campaign runs, so a second campaign with the same --name is refused instead of mixing files.
  const fs::path lock = mine_ / ".lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw std::runtime_error(lock.string() + ": cannot open: " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[128] = {0};
    (void)!::pread(lock_fd_, holder, sizeof holder - 1, 0);
    for (char& ch : holder)
      if (ch == '\n') ch = 0;
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw std::runtime_error("campaign name '" + c_.name + "' is in use by another campaign on this sync directory" +
                             (*holder ? std::string(" (") + holder + ")" : std::string()) +
                             ": give each campaign its own --name");
  }
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host_name() + "\n";
  (void)!::ftruncate(lock_fd_, 0);
  (void)!::pwrite(lock_fd_, me.data(), me.size(), 0);
}

Sync::~Sync() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void Sync::start() {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  // Failures imported by an earlier run of this campaign stay claimed (and a hang stays quarantined).
  for (const fs::path& from : subdirs(c_.out / "imported"))
    for (const fs::path& f : list(from, kCaseFileExtension)) {
      try {
        const CorpusFile cf = read_corpus_file(f);
        if (!cf.verdict) continue;
        claim(c_.out / "work" / "dedup", failure_key(*cf.verdict), *cf.verdict, false, nullptr);
        if (cf.verdict->failure == FailureClass::kHang)
          append_line((c_.out / "work" / "quarantine.txt").string(), cf.verdict->kernel);
        failures_seen_.insert(from.filename().string() + "/" + f.filename().string());
      } catch (const CorpusError&) {
      }
    }
  for (const fs::path& f : list(mine_ / "corpus", kCaseFileExtension)) corpus_seen_.insert(f.filename().string());
  for (const fs::path& f : list(mine_ / "failures", kCaseFileExtension))
    published_failures_.insert(f.filename().string());
  import();
  t_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t_.cpu_seconds += cpu_seconds() - c0;
}

void Sync::round() {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  import();  // first: names the others published are not published again
  publish();
  ++t_.rounds;
  t_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t_.cpu_seconds += cpu_seconds() - c0;
}

void Sync::publish() {
  for (const fs::path& f : list(c_.corpus, kCaseFileExtension)) {
    const std::string name = f.filename().string();
    if (corpus_seen_.count(name)) continue;
    std::string text;  // written whole by this campaign (or imported, then seen): no second parse here
    if (!read_text(f, text)) continue;
    if (publish_file(mine_ / "corpus", name, text)) {
      corpus_seen_.insert(name);
      ++t_.published_corpus;
    }
  }
  for (const fs::path& f : list(c_.out / "failures", kCaseFileExtension)) {
    const std::string name = f.filename().string();
    if (published_failures_.count(name)) continue;
    std::string text;
    if (!read_text(f, text)) continue;
    try {
      (void)parse_corpus(text, f.string());
    } catch (const CorpusError&) {
      published_failures_.insert(name);  // listed as unreadable in the campaign's summary
      continue;
    }
    if (copy_failure(f, mine_ / "failures", text)) {
      published_failures_.insert(name);
      ++t_.published_failures;
    }
  }
}

void Sync::import() {
  const fs::path inbox = c_.out / "work" / "sync-in", dedup = c_.out / "work" / "dedup";
  for (const fs::path& other : subdirs(c_.dir)) {
    const std::string from = other.filename().string();
    if (from == c_.name) continue;
    // Corpus entries: into the local corpus (a resumed campaign loads them) and the workers' inbox.
    for (const fs::path& f : list(other / "corpus", kCaseFileExtension)) {
      const std::string name = f.filename().string();
      if (!corpus_seen_.insert(name).second) continue;
      std::error_code ec;
      if (fs::exists(c_.corpus / name, ec)) continue;  // found here too
      std::string text;
      CorpusFile cf;
      if (!read_case_file(f, c_.quiet, text, cf)) continue;
      if (!publish_file(c_.corpus, name, text)) continue;
      FuzzInput in;
      in.the_case = cf.the_case;
      std::string kernel = cf.verdict ? cf.verdict->kernel : "";
      if (cf.the_case.label.rfind("fuzz-", 0) == 0) kernel = cf.the_case.label.substr(5);
      const auto k = std::find(c_.kernels.begin(), c_.kernels.end(), kernel);
      in.kernel = k == c_.kernels.end() ? 0 : static_cast<uint32_t>(k - c_.kernels.begin());
      const auto b = encode(in, c_.limits);
      const FuzzInput back = decode(b.data(), b.size(), c_.limits);
      const auto nb = encode(back, c_.limits);  // normalised into this campaign's limits
      const std::string bytes(nb.begin(), nb.end());
      publish_file(inbox, hex16(hash64(bytes)), bytes);
      ++t_.imported_corpus[from];
    }
    // Failures: a (kernel, class, signature) nobody here has claimed is claimed and kept in OUT/imported.
    for (const fs::path& f : list(other / "failures", kCaseFileExtension)) {
      if (!failures_seen_.insert(from + "/" + f.filename().string()).second) continue;
      std::string text;
      CorpusFile cf;
      if (!read_case_file(f, c_.quiet, text, cf)) continue;
      if (!cf.verdict || cf.verdict->verdict != Verdict::kFail) continue;
      bool claimed = false;
      claim(dedup, failure_key(*cf.verdict), *cf.verdict, true, &claimed);
      if (!claimed) continue;  // found here too (or imported from a third campaign)
      if (!copy_failure(f, c_.out / "imported" / from, text)) continue;
      if (cf.verdict->failure == FailureClass::kHang)
        append_line((c_.out / "work" / "quarantine.txt").string(), cf.verdict->kernel);
      if (!c_.quiet) {
        std::printf("attn-fuzz: sync: imported %s %s from %s\n", failure_class_name(cf.verdict->failure),
                    cf.verdict->kernel.c_str(), from.c_str());
        std::fflush(stdout);
      }
    }
  }
}

SyncTotals Sync::totals() const {
  SyncTotals t = t_;
  t.imported_inputs_run = static_cast<int64_t>(list(c_.out / "work" / "sync-in" / "taken", "").size());
  return t;
}

std::vector<ImportedFailure> Sync::imported_failures() const {
  std::vector<ImportedFailure> out;
  for (const fs::path& from : subdirs(c_.out / "imported"))
    for (const fs::path& f : list(from, kCaseFileExtension)) {
      try {
        CorpusFile cf = read_corpus_file(f);
        if (!cf.verdict) continue;
        struct timespec t {};
        mtime_of(f, t);
        out.push_back({from.filename().string(), f, *cf.verdict, cf.the_case, t.tv_sec});
      } catch (const CorpusError&) {
      }
    }
  return out;
}

std::optional<std::vector<uint8_t>> take_synced_input(const std::string& out, size_t max_size) {
  // While the inbox had something, look again at once (drain it); when empty, look once a second.
  static auto next_look = std::chrono::steady_clock::time_point{};
  const auto now = std::chrono::steady_clock::now();
  if (now < next_look) return std::nullopt;
  const fs::path inbox = fs::path(out) / "work" / "sync-in", taken = inbox / "taken";
  for (const fs::path& f : list(inbox, "")) {
    const fs::path mine = taken / f.filename();
    if (::rename(f.c_str(), mine.c_str()) != 0) continue;  // another worker took it
    std::string bytes;
    if (!read_regular_file(mine, 1 << 24, bytes).empty() || bytes.size() > max_size) continue;
    return std::vector<uint8_t>(bytes.begin(), bytes.end());
  }
  next_look = now + std::chrono::seconds(1);
  return std::nullopt;
}

// ----------------------------------------------------------------------------------------------- merge

namespace {

struct MergedFailure {
  RecordedVerdict verdict;
  Case the_case;
  fs::path path;  // the file it was read from
  std::string first_by;
  std::time_t found_at = 0;
  double found_at_exact = 0;  // with the nanoseconds of the mtime: who was first within a second
  double found_after_s = -1;  // since its finder's first start (campaign time across resumes)
  bool after_merge_start = false;  // its finder is not merged (or left no report): since the merge's first start
  std::string replay_flags;
  std::set<std::string> also_by;
  CorpusFile grouped;  // what findings group by: its campaign's minimal case (OUT/minimized/<name>), else this one
  fs::path minimal;    // that minimal case's file (empty: none)
  InputTier tier = InputTier::kOrdinary;  // of `grouped` (set by merge_campaigns)
};

struct CampaignInfo {
  std::string name, dir, started_at;
  std::time_t started = 0;  // its first start (a resumed campaign: the first run's)
  Json stats;               // report.json's "campaign" section (empty when the campaign left none)
  std::map<std::string, double> after;  // failure file -> found_after_s its report gives (history.json)
  int64_t own = 0, imported = 0, first = 0;
};

struct Merge {
  std::vector<CampaignInfo> camps;
  std::map<std::string, MergedFailure> by_key;
  std::vector<uint8_t> feature_union;
  bool have_union = true;
  std::time_t earliest = 0;  // the first start among the campaigns with a report
};

// Refused before anything is read or written: an --out that is one of the campaigns (its own report would be
// overwritten by the merge's), a campaign given twice (it would be counted twice).
bool refuse_dirs(const std::vector<std::string>& dirs, const std::string& out_dir) {
  std::error_code ec;
  const fs::path outc = fs::weakly_canonical(fs::absolute(out_dir), ec);
  std::map<fs::path, std::string> seen;
  for (const std::string& d : dirs) {
    std::error_code dec;
    const fs::path dc = fs::weakly_canonical(fs::absolute(d), dec);
    if (const auto [it, fresh] = seen.emplace(dc, d); !fresh) {
      std::fprintf(stderr, "attn-fuzz: --merge: %s is given twice (%s and %s): list each campaign once\n",
                   dc.c_str(), it->second.c_str(), d.c_str());
      return true;
    }
    if (dc == outc) {
      std::fprintf(stderr,
                   "attn-fuzz: --merge: --out %s is one of the campaigns merged (its report would be "
                   "overwritten): choose another --out\n",
                   out_dir.c_str());
      return true;
    }
  }
  return false;
}

// A resumed campaign's report counts its last run's cases and seconds; the merge counts the whole campaign: every
// run's cases, seconds and rate (a ten-minute campaign run as two five-minute halves was merged as its second half).
void sum_runs(Json& c) {
  if (!c.is_object() || !c.contains("runs") || !c.at("runs").is_array() || c.at("runs").size() < 2) return;
  int64_t cases = 0;
  double wall = 0;
  for (const Json& r : c.at("runs")) {
    cases += r.value("cases", int64_t{0});
    wall += r.value("wall_s", 0.0);
  }
  c["cases"] = cases;
  c["wall_s"] = wall;
  c["cases_per_s"] = wall > 0 ? static_cast<double>(cases) / wall : 0.0;
}

// report.json's campaign section into ci (none: stays null). false: said why on stderr.
bool read_report(const fs::path& rj, CampaignInfo& ci) {
  std::string text;
  if (!read_text(rj, text)) return true;
  try {
    const Json j = Json::parse(text);
    if (!j.is_object() || j.value("schema", std::string()) != kReportSchemaName || !j.contains("schema_version") ||
        (j.at("schema_version") != kReportSchemaVersion && j.at("schema_version") != 1)) {
      const std::string v = j.is_object() && j.contains("schema_version") ? j.at("schema_version").dump() : "none";
      std::fprintf(stderr, "attn-fuzz: %s: report schema %s version %s; this attn-fuzz merges %s versions 1 to %d only\n",
                   rj.c_str(), j.is_object() ? j.value("schema", std::string("(none)")).c_str() : "(none)", v.c_str(),
                   kReportSchemaName, kReportSchemaVersion);
      return false;
    }
    if (j.contains("campaign")) ci.stats = j.at("campaign");
    sum_runs(ci.stats);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: %s: not a readable report: %s\n", rj.c_str(), e.what());
    return false;
  }
  return true;
}

// The campaign's name, first start, failure times and semantic features from its report.
void take_stats(CampaignInfo& ci, Merge& m) {
  if (!ci.stats.is_object()) {
    m.have_union = false;
    return;
  }
  ci.name = ci.stats.value("name", ci.name);
  const int64_t first = ci.stats.value("first_started_unix", int64_t{0});
  ci.started = first > 0 ? first : ci.stats.value("started_unix", int64_t{0});
  ci.started_at = ci.stats.value("started_at", std::string());
  if (ci.stats.contains("failures") && ci.stats.at("failures").is_array())
    for (const Json& f : ci.stats.at("failures"))
      if (f.contains("found_after_s")) ci.after[f.value("file", std::string())] = f.at("found_after_s").get<double>();
  if (ci.started > 0 && (m.earliest == 0 || ci.started < m.earliest)) m.earliest = ci.started;
  const std::string hex = ci.stats.value("features_hex", std::string());
  if (hex.empty()) m.have_union = false;
  if (m.feature_union.size() < hex.size() / 2) m.feature_union.resize(hex.size() / 2, 0);
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    m.feature_union[i / 2] |= static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16));
}

// One failure file found by `by` (own: in the campaign's failures/, else imported from `by`).
void take_failure(const fs::path& f, const std::string& by, bool own, const std::string& flags, CampaignInfo& ci,
                  Merge& m) {
  CorpusFile cf;
  try {
    cf = read_corpus_file(f);
  } catch (const CorpusError& e) {
    std::fprintf(stderr, "attn-fuzz: skipping unreadable failure file: %s\n", e.what());
    return;
  }
  if (!cf.verdict || cf.verdict->verdict != Verdict::kFail) return;
  struct timespec t {};
  mtime_of(f, t);
  ++(own ? ci.own : ci.imported);
  const std::string key = failure_key(*cf.verdict);
  auto it = m.by_key.find(key);
  const double exact = static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  if (it != m.by_key.end() && exact >= it->second.found_at_exact) {
    if (it->second.first_by != by) it->second.also_by.insert(by);
    return;
  }
  MergedFailure mf;
  mf.verdict = *cf.verdict;
  mf.the_case = cf.the_case;
  mf.path = f;
  mf.first_by = by;
  mf.found_at = t.tv_sec;
  mf.found_at_exact = exact;
  mf.replay_flags = flags;
  mf.grouped = cf;
  const fs::path minimal = f.parent_path().parent_path() / "minimized" / f.filename();
  std::error_code ec;
  if (fs::exists(minimal, ec)) {
    try {
      mf.grouped = read_corpus_file(minimal);
      mf.minimal = minimal;
    } catch (const CorpusError&) {  // unreadable: grouped as found
    }
  }
  if (it != m.by_key.end()) {
    mf.also_by = it->second.also_by;
    mf.also_by.insert(it->second.first_by);
  }
  mf.also_by.erase(by);
  m.by_key[key] = std::move(mf);
}

// One campaign directory: its report and its failures (own and imported). false: said why on stderr.
bool read_campaign(const std::string& d, bool quiet, Merge& m) {
  CampaignInfo ci;
  ci.dir = d;
  ci.name = fs::path(d).lexically_normal().filename().string();
  if (ci.name.empty()) ci.name = fs::path(d).lexically_normal().parent_path().filename().string();
  if (!read_report(fs::path(d) / "report.json", ci)) return false;
  std::error_code ec;
  for (const char* sub : {"failures", "imported"})
    if (fs::exists(fs::path(d) / sub, ec) && !fs::is_directory(fs::path(d) / sub, ec)) {
      std::fprintf(stderr, "attn-fuzz: %s is not a directory: %s is no campaign directory\n",
                   (fs::path(d) / sub).c_str(), d.c_str());
      return false;
    }
  if (ci.stats.is_null() && !fs::is_directory(fs::path(d) / "failures", ec)) {
    std::fprintf(stderr,
                 "attn-fuzz: %s is not a campaign directory (no report.json with a campaign section, no "
                 "failures/)\n",
                 d.c_str());
    return false;
  }
  if (ci.stats.is_null() && !quiet)
    std::fprintf(stderr, "attn-fuzz: %s has no campaign report (still running, or killed): failures only\n",
                 d.c_str());
  take_stats(ci, m);
  const std::string flags = ci.stats.is_object() ? ci.stats.value("replay_flags", std::string()) : "";
  for (const fs::path& f : list(fs::path(d) / "failures", kCaseFileExtension)) take_failure(f, ci.name, true, flags, ci, m);
  for (const fs::path& from : subdirs(fs::path(d) / "imported"))
    for (const fs::path& f : list(from, kCaseFileExtension))
      take_failure(f, from.filename().string(), false, flags, ci, m);
  m.camps.push_back(std::move(ci));
  return true;
}

// Who found each failure first, and after how long: the finder's own report (campaign time, resumes included),
// else since its first start; a finder that is not merged: since the merge's first start.
void time_failures(Merge& m) {
  for (auto& [key, f] : m.by_key) {
    (void)key;
    const CampaignInfo* finder = nullptr;
    for (CampaignInfo& c : m.camps)
      if (c.name == f.first_by) ++c.first, finder = &c;
    const std::string file = f.path.filename().string();
    if (finder && finder->after.count(file)) {
      f.found_after_s = finder->after.at(file);
    } else if (finder && finder->started > 0) {
      f.found_after_s = std::max(0.0, f.found_at_exact - static_cast<double>(finder->started));
    } else if (m.earliest > 0) {
      f.found_after_s = std::max(0.0, f.found_at_exact - static_cast<double>(m.earliest));
      f.after_merge_start = true;
    }
  }
}

std::string after_cell(const MergedFailure& f) {
  if (f.found_after_s < 0) return "- (no campaign report)";
  return std::to_string(static_cast<long long>(f.found_after_s)) + " s" + (f.after_merge_start ? " *" : "");
}

// The distinct failures copied into OUT/failures (case, report, heatmap) as report entries, and their JSON; a
// minimized one's minimal case into OUT/minimized, which its entry shows and replays (as in a campaign's summary).
bool copy_failures(const std::vector<const MergedFailure*>& order, const fs::path& out, RunRecord& rec, Json& jf) {
  const fs::path fdir = out / "failures", mdir = out / "minimized";
  std::error_code ec;
  for (const MergedFailure* m : order) {
    std::string text;
    if (!read_text(m->path, text) || !copy_failure(m->path, fdir, text)) {
      std::fprintf(stderr, "attn-fuzz: cannot copy %s into %s\n", m->path.c_str(), fdir.c_str());
      return false;
    }
    fs::path saved = fdir / m->path.filename();
    if (!m->minimal.empty()) {
      fs::create_directories(mdir, ec);
      if (ec || !fs::copy_file(m->minimal, mdir / m->minimal.filename(), fs::copy_options::overwrite_existing, ec)) {
        std::fprintf(stderr, "attn-fuzz: cannot copy %s into %s\n", m->minimal.c_str(), mdir.c_str());
        return false;
      }
      saved = mdir / m->minimal.filename();
    }
    RunEntry e;
    e.the_case = m->minimal.empty() ? m->the_case : m->grouped.the_case;
    e.result = recorded_result(m->verdict);
    e.result.evidence.push_back({"first-found-by", m->first_by + " at " + iso_utc(m->found_at)});
    e.corpus_path = saved.string();
    e.replay_command = "attn-check --replay " + shell_quote(saved.string()) +
                       (m->replay_flags.empty() ? "" : " " + m->replay_flags);
    const fs::path svg = fdir / (m->path.stem().string() + ".svg");
    if (fs::exists(svg, ec)) e.heatmap_path = fs::relative(svg, out, ec).string();
    if (rec.device.empty()) rec.device = m->verdict.device;
    Json a = Json::array();
    for (const auto& b : m->also_by) a.push_back(b);
    jf.push_back({{"kernel", m->verdict.kernel},
                  {"class", failure_class_name(m->verdict.failure)},
                  {"signature", m->verdict.signature},
                  {"file", (fdir / m->path.filename()).string()},
                  {"minimized", m->minimal.empty() ? Json() : Json(saved.string())},
                  {"first_found_by", m->first_by},
                  {"found_at", iso_utc(m->found_at)},
                  {"found_after_s", m->found_after_s},
                  {"found_after_s_from", m->after_merge_start ? "merge-start" : "finder-start"},
                  {"also_found_by", a},
                  {"tier", input_tier_name(m->tier)},
                  {"replay", e.replay_command}});
    rec.entries.push_back(std::move(e));
  }
  return true;
}

struct Totals {
  int64_t cases = 0, union_features = 0;
  double rate = 0;
  TierTally tiers;  // the distinct failures by input tier, --fail-tiers applied
};

Json campaigns_json(const Merge& m) {
  Json jc = Json::array();
  for (const CampaignInfo& c : m.camps) {
    Json x;
    x["name"] = c.name;
    x["dir"] = c.dir;
    x["started_at"] = c.started_at;
    x["report"] = c.stats.is_object();
    for (const char* k : {"cases", "cases_per_s", "wall_s", "semantic_features", "interrupted"})
      if (c.stats.is_object() && c.stats.contains(k)) x[k] = c.stats[k];
    x["distinct_failures_found"] = c.own;
    x["failures_imported"] = c.imported;
    x["first_found"] = c.first;
    if (c.stats.is_object() && c.stats.contains("sync")) x["sync"] = c.stats["sync"];
    jc.push_back(std::move(x));
  }
  return jc;
}

// How many of the failures are shown as their campaign's minimal case.
size_t count_minimized(const std::vector<const MergedFailure*>& order) {
  return static_cast<size_t>(std::count_if(order.begin(), order.end(), [](const MergedFailure* f) {
    return !f->minimal.empty();
  }));
}

void print_merge(const Merge& m, const Totals& t, const std::vector<const MergedFailure*>& order,
                 const RunRecord& rec) {
  std::printf("attn-fuzz --merge: %zu campaign(s), %lld case(s) (%.0f/s together), %zu distinct failure(s)\n",
              m.camps.size(), (long long)t.cases, t.rate, order.size());
  std::printf("%-24s %10s %8s %9s %6s %6s %8s\n", "campaign", "cases", "cases/s", "features", "found", "first",
              "imported");
  for (const CampaignInfo& c : m.camps)
    std::printf("%-24s %10lld %8.1f %9lld %6lld %6lld %8lld\n", c.name.c_str(),
                (long long)(c.stats.is_object() ? c.stats.value("cases", int64_t{0}) : -1),
                c.stats.is_object() ? c.stats.value("cases_per_s", 0.0) : 0.0,
                (long long)(c.stats.is_object() ? c.stats.value("semantic_features", int64_t{0}) : -1),
                (long long)c.own, (long long)c.first, (long long)c.imported);
  if (const size_t minimized = count_minimized(order))
    std::printf("%zu minimized: their replay is the minimal case's (OUT/minimized; the case as found: OUT/failures)\n",
                minimized);
  if (!order.empty())
    std::printf("%-18s %-13s %-30s %-22s %-16s %-20s %-10s %s\n", "inputs", "class", "kernel", "signature",
                "first found by", "at", "after", "replay");
  for (size_t i = 0; i < order.size(); ++i)
    std::printf("%-18s %-13s %-30s %-22s %-16s %-20s %-10s %s\n", input_tier_name(order[i]->tier),
                failure_class_name(order[i]->verdict.failure), order[i]->verdict.kernel.c_str(),
                order[i]->verdict.signature.c_str(), order[i]->first_by.c_str(),
                iso_utc(order[i]->found_at).c_str(), after_cell(*order[i]).c_str(),
                rec.entries[i].replay_command.c_str());
}

std::string merge_markdown(const Merge& m, const Totals& t, const std::vector<const MergedFailure*>& order,
                           const RunRecord& rec, const std::string& command_line, const std::vector<Finding>& findings) {
  std::ostringstream md;
  md << "# attn-fuzz merged campaigns\n\n- command: `" << command_line << "`\n- " << m.camps.size()
     << " campaign(s), " << t.cases << " cases (" << static_cast<long long>(t.rate) << "/s together), **"
     << order.size() << " distinct failure(s)**";
  if (m.have_union && !m.camps.empty()) md << "; semantic features covered together: " << t.union_features;
  if (!order.empty()) md << "\n- failures by input tier: " << input_tier_counts(t.tiers.n);
  if (const size_t minimized = count_minimized(order))
    md << "\n- " << minimized << " minimized: their replay is the minimal case's (minimized/; as found: failures/)";
  md << "\n\n| campaign | started | cases | cases/s | features | failures found | first found | imported |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  for (const CampaignInfo& c : m.camps) {
    const bool s = c.stats.is_object();
    md << "| " << markdown_escape(c.name) << " | " << markdown_escape(c.started_at) << " | "
       << (s ? std::to_string(c.stats.value("cases", int64_t{0})) : "?") << " | "
       << (s ? std::to_string(static_cast<long long>(c.stats.value("cases_per_s", 0.0))) : "?") << " | "
       << (s ? std::to_string(c.stats.value("semantic_features", int64_t{0})) : "?") << " | " << c.own << " | "
       << c.first << " | " << c.imported << " |\n";
  }
  md << "\n";
  if (!order.empty()) {
    bool starred = false;
    md << "| inputs | class | kernel | signature | first found by | at | after | also found by | replay |\n"
       << "|---|---|---|---|---|---|---|---|---|\n";
    for (size_t i = 0; i < order.size(); ++i) {
      const MergedFailure& f = *order[i];
      starred |= f.after_merge_start;
      std::string also;
      for (const auto& b : f.also_by) also += (also.empty() ? "" : ", ") + b;
      md << "| " << input_tier_name(f.tier) << " | " << failure_class_name(f.verdict.failure) << " | "
         << markdown_escape(f.verdict.kernel) << " | " << markdown_escape(f.verdict.signature) << " | "
         << markdown_escape(f.first_by) << " | " << iso_utc(f.found_at) << " | "
         << markdown_escape(after_cell(f)) << " | " << markdown_escape(also) << " | `"
         << rec.entries[i].replay_command << "` |\n";
    }
    md << "\n";
    if (starred)
      md << "\\* after the first start among the merged campaigns (the finder is not among them or left no "
            "report); otherwise after the finder's own first start, its earlier runs included\n\n";
  }
  md << findings_markdown(findings);
  std::istringstream in(markdown_summary(rec));  // under this page's title: its headings one level down
  for (std::string line; std::getline(in, line);) md << (line.rfind('#', 0) == 0 ? "#" : "") << line << "\n";
  return md.str();
}

}  // namespace

int merge_campaigns(const std::vector<std::string>& dirs, const std::string& out_dir,
                    const std::string& command_line, bool quiet, const std::string& fail_tiers) {
  if (refuse_dirs(dirs, out_dir)) return 2;
  Merge m;
  for (const std::string& d : dirs)
    if (!read_campaign(d, quiet, m)) return 2;
  time_failures(m);
  // Output: the distinct failures (case + heatmap copied), then the reports.
  const fs::path out = out_dir;
  std::error_code ec;
  fs::create_directories(out / "failures", ec);
  if (ec) {
    std::fprintf(stderr, "attn-fuzz: cannot create %s: %s\n", (out / "failures").c_str(), ec.message().c_str());
    return 2;
  }
  std::vector<const MergedFailure*> order;
  for (auto& [k, f] : m.by_key) {
    f.tier = input_tier(f.grouped.the_case);
    order.push_back(&f);
  }
  std::sort(order.begin(), order.end(),
            [](const MergedFailure* a, const MergedFailure* b) {  // ordinary first
              if (a->tier != b->tier) return a->tier < b->tier;
              return a->found_at_exact != b->found_at_exact ? a->found_at_exact < b->found_at_exact
                                                            : a->path < b->path;
            });
  RunRecord rec;
  rec.tool.name = "attn-fuzz";
  rec.tool.command = command_line;
  Totals t;
  for (const CampaignInfo& c : m.camps)
    if (c.stats.is_object()) {
      t.cases += c.stats.value("cases", int64_t{0});
      t.rate += c.stats.value("cases_per_s", 0.0);
      rec.wall_s = std::max(rec.wall_s, c.stats.value("wall_s", 0.0));
      if (rec.backend.empty()) rec.backend = c.stats.value("backend", std::string());
    }
  for (uint8_t b : m.feature_union) t.union_features += __builtin_popcount(b);
  std::vector<InputTier> tiers;
  for (const MergedFailure* f : order) tiers.push_back(f->tier);
  t.tiers = tally_tiers(tiers, fail_tiers);
  Json jf = Json::array();
  if (!copy_failures(order, out, rec, jf)) return 2;
  std::vector<const CorpusFile*> grouped;
  for (const MergedFailure* f : order) grouped.push_back(&f->grouped);
  const std::vector<Finding> findings = group_findings(grouped);
  if (!quiet) {
    print_merge(m, t, order, rec);
    if (!order.empty()) std::printf("failures by input tier: %s\n", input_tier_counts(t.tiers.n).c_str());
    std::printf("%zu finding(s): the distinct failures grouped by class, deciding evidence and minimal input pattern\n",
                findings.size());
    for (const Finding& g : findings) std::printf("  %s\n", finding_line(g).c_str());
  }
  try {
    const ReportPaths paths = write_reports(rec, out);
    Json j = report_to_json(rec);
    Json mj;
    mj["campaigns"] = campaigns_json(m);
    mj["cases"] = t.cases;
    mj["cases_per_s"] = t.rate;
    mj["semantic_features_union"] = m.have_union && !m.camps.empty() ? Json(t.union_features) : Json(nullptr);
    mj["distinct_failures"] = order.size();
    Json by_tier = Json::object();
    for (InputTier x : kInputTiers) by_tier[input_tier_name(x)] = t.tiers.n[static_cast<int>(x)];
    mj["failures_by_tier"] = by_tier;
    mj["fail_tiers"] = fail_tiers;
    mj["failures_counted"] = t.tiers.counted;
    mj["failures"] = jf;
    std::vector<std::string> names;
    for (const MergedFailure* f : order) names.push_back(f->path.filename().string());
    mj["findings"] = findings_json(findings, names);
    j["merge"] = mj;
    write_text_file(paths.json, report_json_text(j));
    write_text_file(paths.markdown, merge_markdown(m, t, order, rec, command_line, findings));
    if (!quiet) std::printf("reports: %s  %s  %s\n", paths.markdown.c_str(), paths.json.c_str(), paths.junit.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: cannot write reports: %s\n", e.what());
    return 2;
  }
  return order.empty() ? 0 : tier_exit_status(t.tiers, fail_tiers);
}

}  // namespace attnfuzz::fuzz
