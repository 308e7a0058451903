// campaign.cpp - attn-fuzz's parent process: run_campaign, the phases of a campaign in order (they live in
// fuzz/campaign_*.cpp, declared in campaign_phases.h), and the supervision loop between start and summary.
#include "fuzz/campaign.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "fuzz/campaign_phases.h"

namespace attnfuzz::fuzz {

namespace campaign {

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> read_lines_all(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

std::vector<FoundLine> read_found(const Paths& p) {
  std::vector<FoundLine> out;
  for (const std::string& line : read_lines_all(p.work / "found.txt")) {
    std::istringstream in(line);
    FoundLine f;
    if (in >> f.file >> f.found >> f.classified) out.push_back(std::move(f));
  }
  return out;
}

const KernelEntry* kernel_for(const FuzzInput& in, const Kernels& ks,
                              const std::vector<std::string>& quarantined) {
  for (size_t i = 0; i < ks.size(); ++i) {
    const KernelEntry* k = ks[(in.kernel + i) % ks.size()];
    if (std::find(quarantined.begin(), quarantined.end(), k->kernel.name) != quarantined.end()) continue;
    // The worker's rule (fuzz/worker.cpp): the kernel must claim the case's pass too, so an artifact of a
    // backward case is blamed on the kernel that ran it.
    if (case_unsupported_reason(k->kernel, in.the_case.problem, in.the_case.pass).empty()) return k;
  }
  return nullptr;
}

namespace {

// The worker binary is there, and the kernels it will run (the parent needs the selection to map corpus
// cases to kernels and artifacts to failures). false: said why on stderr.
bool select_kernels(const CampaignOptions& o, Kernels& kernels) {
  if (::access(o.worker_binary.c_str(), X_OK) != 0) {
    std::fprintf(
        stderr,
        "attn-fuzz: the libFuzzer worker %s is missing (configure with -DATTNFUZZ_FUZZ=ON and build target "
        "attn-fuzz-worker)\n",
        o.worker_binary.c_str());
    return false;
  }
  Backend backend;
  if (!parse_backend(o.worker.backend, backend)) {
    std::fprintf(stderr, "attn-fuzz: unknown backend %s\n", o.worker.backend.c_str());
    return false;
  }
  try {
    kernels = Registry::global().select(backend, o.worker.kernels);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
    return false;
  }
  return true;
}

// --sync: what the other campaigns published so far comes in first (their corpus entries are then loaded
// with the local corpus; their failures are claimed, so local workers do not save them again). null: said
// why on stderr.
std::unique_ptr<Sync> start_sync(const CampaignOptions& o, const Paths& p, const std::string& name,
                                 const Kernels& kernels) {
  SyncConfig sc;
  sc.dir = o.sync_dir;
  sc.name = name;
  sc.out = p.out;
  sc.corpus = p.corpus;
  sc.limits = o.worker.limits;
  for (const KernelEntry* k : kernels) sc.kernels.push_back(k->kernel.name);
  sc.quiet = o.quiet;
  try {
    auto sync = std::make_unique<Sync>(sc);
    sync->start();
    return sync;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn-fuzz: --sync %s: %s\n", o.sync_dir.c_str(), e.what());
    return nullptr;
  }
}

void print_banner(const CampaignOptions& o, const Paths& p, const Kernels& kernels, const CorpusIn& in,
                  const FuzzerProcesses& fuzzers) {
  const size_t groups = fuzzers.groups();
  std::printf(
      "attn-fuzz %s: %zu kernel%s on %s, %u worker%s%s, corpus %s (%lld case file(s), %lld seed(s)%s), "
      "out %s%s\n",
      ATTNFUZZ_VERSION, kernels.size(), kernels.size() == 1 ? "" : "s", o.worker.backend.c_str(), fuzzers.workers(),
      fuzzers.workers() == 1 ? "" : "s",
      groups > 1 ? (" in " + std::to_string(groups) + " GPU groups").c_str() : "", p.corpus.c_str(),
      (long long)in.loaded, (long long)in.seeds,
      in.skipped ? (", " + std::to_string(in.skipped) + " skipped").c_str() : "", p.out.c_str(),
      o.max_time_s > 0 ? (", " + std::to_string(static_cast<int>(o.max_time_s)) + " s").c_str() : "");
  std::fflush(stdout);
}

// What runs while the workers do: artifacts become failures, --mps suspects are re-run, the Stop decides,
// progress lines, corpus out and --sync rounds on their intervals. Returns when every libFuzzer process
// ended.
struct Supervisor {
  const CampaignOptions& o;
  FuzzerProcesses& fuzzers;
  Stop& stop;
  ArtifactScanner& artifacts;
  MpsRechecks& rechecks;
  Progress& progress;
  CorpusOut& corpus_out;
  Sync* sync;
  const Clock& clock;

  void run() {
    double next_progress = o.progress_s, next_sync = o.sync_interval_s;
    while (!fuzzers.reap()) {
      if (!stop.stopping()) artifacts.scan();
      rechecks.step();
      stop.step(clock, fuzzers);
      if (!o.quiet && !stop.stopping() && clock.elapsed() >= next_progress) {
        progress.print(false, fuzzers, artifacts);
        corpus_out.save_new();
        next_progress += o.progress_s;
      }
      if (sync && !stop.stopping() && clock.elapsed() >= next_sync) {
        corpus_out.save_new();
        sync->round();
        next_sync += o.sync_interval_s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(stop.stopping() ? 50 : 200));
    }
  }
};

}  // namespace

}  // namespace campaign

// The phases in order: OUT (lock, reset, resume), kernels, --sync start, corpus in, workers (config,
// lifeline, scratch, MPS, libFuzzer processes), supervision until they end, wind-down, summary.
int run_campaign(const CampaignOptions& given) {
  using namespace campaign;
  CampaignOptions o = given;
  const WorkerConfig& cfg = o.worker;
  const Paths p(o);
  if (!lock_out(p) || !reset_work(p)) return 2;
  Kernels kernels;
  if (!select_kernels(o, kernels)) return 2;
  for (const KernelEntry* k :
       kernels) {  // merged states (issue 29): merge kernels get merge cases from the decoder
    if (k->kernel.kind == AF_KIND_MERGE) o.worker.limits.merge = true;
    // MLA dims (issue 28 item 5): only when --variant kv-shared is on and a kernel declares kv-shared at D
    // 576 / Dv 512
    o.worker.limits.mla_dims |=
        (o.worker.limits.variants & AF_VARIANT_KV_SHARED) && (k->kernel.variants & AF_VARIANT_KV_SHARED) &&
        (k->kernel.max_head_dim == 0 || k->kernel.max_head_dim >= fuzz::kMlaHeadDim) &&
        (k->kernel.max_head_dim_v == 0 || k->kernel.max_head_dim_v >= fuzz::kMlaHeadDimV);
  }
  claim_earlier_failures(p);
  Outcome r;
  r.history = read_history(p);  // a resume: the earlier runs, their failures' times, the campaign's name
  r.name = !o.name.empty() ? o.name : !r.history.name.empty() ? r.history.name : default_campaign_name();
  r.history.name = r.name;
  r.started_unix = std::time(nullptr);
  for (const KernelEntry* k : kernels) r.kernels.push_back(k->kernel.name);
  r.max_failures = o.max_failures;
  r.all_failures = o.all_failures;
  std::unique_ptr<Sync> sync;
  if (!o.sync_dir.empty() && !(sync = start_sync(o, p, r.name, kernels))) return 2;
  const CorpusIn in = load_corpus(p, o.seed_dirs, kernels, cfg.limits);

  // The workers: their configuration, the lifeline, then the libFuzzer fork-mode processes (one per GPU
  // group).
  const fs::path cfg_path = write_worker_config(o, p);
  FuzzerProcesses fuzzers(o, p);
  Lifeline life;
  if (!life.open()) return 2;
  print_banner(o, p, kernels, in, fuzzers);
  const ForkScratch scratch(p);
  std::unique_ptr<MpsDaemon> mps;  // --mps: one private MPS daemon for all GPU groups, stopped at the end
  if (o.mps) {
    try {
      mps = std::make_unique<MpsDaemon>(p.work / "mps");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn-fuzz: %s\n", e.what());
      return 2;  // (the lifeline's ends are closed on the way out)
    }
  }
  fuzzers.start(cfg_path, life.read, mps.get(), scratch);
  if (!mps) life.close_read();  // (under --mps the re-runs of suspects inherit it too)
  Stop stop(o, p, kernels);

  // Supervision, until every libFuzzer process has ended.
  CorpusOut corpus_out(p, cfg.limits, kernels, o.command_line, in.known);
  const int lf_timeout = libfuzzer_timeout_s(cfg);
  ArtifactScanner artifacts(o, p, kernels, lf_timeout, mps != nullptr);
  MpsRechecks rechecks(o, p, cfg_path, life.read, lf_timeout, mps != nullptr);
  const Clock clock;
  Progress progress(p, clock);
  Supervisor{o, fuzzers, stop, artifacts, rechecks, progress, corpus_out, sync.get(), clock}.run();

  // Wind-down: the last corpus entries and artifacts, the suspects left (--mps), the last --sync round.
  life.close_write();
  stop.restore_signals();
  corpus_out.save_new();
  fuzzers.report_abnormal(stop.stopping());
  artifacts.scan();
  if (mps) {
    rechecks.drain();
    mps->stop();
    life.close_read();
  }
  if (sync) sync->round();  // the last publish: everything this campaign found is in DIR

  // Summary: the distinct failures in this campaign directory, each with its replay command; the kernels
  // quarantined (they hung) and isolated; failure files that could not be read (kept as they are).
  r.stats = progress.print(true, fuzzers, artifacts);
  r.deaths = progress.deaths();
  r.ended = death_reasons(r.deaths, artifacts, p, fuzzers);
  r.wall = clock.elapsed();
  r.interrupted = stop.interrupted();
  r.synced = sync != nullptr;
  if (sync) r.imported = sync->imported_failures();
  r.found = read_failures(p.failures, &r.skipped, false);
  r.quarantined = read_lines(p.quarantine());
  r.isolated = read_lines(p.isolate());
  minimize_failures(o, p, r.isolated, r.found);
  if (sync) r.sync = sync->totals();
  r.mps = mps != nullptr;
  r.mps_rechecked = rechecks.rechecked();
  r.mps_pending = rechecks.pending();
  record_run(p, r.history, {r.started_unix, r.wall, r.stats.cases, r.stats.failing, r.interrupted}, r.found);
  return write_summary(o, p, r);
}

}  // namespace attnfuzz::fuzz
